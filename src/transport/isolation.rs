//! Process isolation of secrets: what a stdio child can read of the gateway and of its siblings
//! (docs/threat-model.md).
//!
//! - **The gateway** makes itself non-dumpable (`PR_SET_DUMPABLE` 0, [`harden_gateway`], the first
//!   thing `main` does): its `/proc/<pid>/environ`, `mem`, `fd/`, `maps` then need
//!   `CAP_SYS_PTRACE` (`ptrace_may_access`), and its `/proc` files belong to root, so a child
//!   under the same uid cannot read the secrets it holds.
//! - **A child** is made non-dumpable by the kernel at `execve` when its effective gid differs
//!   from its real gid (`begin_new_exec`: dumpable = `fs.suid_dumpable`, 0 by default). When
//!   the gateway holds `CAP_SETGID` (a root gateway), every child runs with real gid
//!   [`CHILD_REAL_GID`] and the gateway's effective and saved gid: file access and the group of
//!   the files it creates are unchanged (they use the effective gid), while its siblings — whose
//!   gids never all equal its own — and it itself can no longer read each other
//!   (`ptrace_may_access` compares every gid and then wants `CAP_SYS_PTRACE`).
//! - **No capabilities.** When the gateway holds `CAP_SETPCAP`, every capability leaves the
//!   child's bounding set; the inheritable and ambient sets are always emptied. A root child's
//!   permitted set after `execve` is bounding ∪ inheritable: empty, so it holds no
//!   `CAP_SYS_PTRACE`, `CAP_DAC_OVERRIDE`, `CAP_SYS_ADMIN`, … and neither does anything it starts.
//!
//! The kernel treats an exec with differing real and effective gids as a set-gid exec
//! (`AT_SECURE`): the dynamic loader ignores `LD_*`, glibc drops `TMPDIR`, `LOCPATH`, `TZDIR`,
//! …, OpenSSL ignores `SSL_CERT_FILE`/`SSL_CERT_DIR`, Node ignores `NODE_OPTIONS` and
//! `NODE_EXTRA_CA_CERTS`, and the parent-death signal is cleared (the reaper,
//! [`super::reaper`], still sweeps the children when the gateway dies). This is the price of a
//! non-dumpable child and is documented in the threat model.
//!
//! Every step runs in the forked child before `execve`, with async-signal-safe system calls only
//! and no allocation. A step that fails fails the spawn with `child-isolation-failed` naming the
//! step ([`decode_spawn_error`]); a step is skipped only when the gateway itself lacks what it
//! needs (the capability, a mapped gid) or the kernel predates it (ambient capabilities, 4.3),
//! which [`plan`] decides once and [`describe`] reports (startup log, `graph-os doctor`).

use std::io;
use std::sync::OnceLock;

/// The real gid every child of a gateway holding `CAP_SETGID` runs with (`nogroup`).
pub const CHILD_REAL_GID: libc::gid_t = 65534;
/// The real gid used instead when the gateway's own effective gid is [`CHILD_REAL_GID`].
const CHILD_REAL_GID_ALT: libc::gid_t = 65533;

const CAP_SETGID: u32 = 6;
const CAP_SETPCAP: u32 = 8;
/// Capability numbers are below 64 (two 32-bit words, `_LINUX_CAPABILITY_VERSION_3`).
const CAP_WORDS: usize = 2;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Marks a pre-exec failure in the errno the child hands back: `MARK | step << 16 | errno`.
const ERROR_MARK: i32 = 0x4700_0000;
const ERROR_MARK_MASK: i32 = 0x7f00_0000;

/// What is done to every child before `execve`, decided once from the gateway's own credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildPlan {
    /// `setresgid(real, egid, egid)`: the child is non-dumpable after exec.
    pub split_gid: Option<(libc::gid_t, libc::gid_t)>,
    /// Drop every capability from the bounding set (needs `CAP_SETPCAP`).
    pub drop_bounding: bool,
}

/// The steps of [`apply_in_child`], as named in `child-isolation-failed` errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// `setresgid`.
    SplitGid = 1,
    /// `capset` of the inheritable set.
    ClearInheritable = 2,
    /// `PR_CAPBSET_DROP`.
    DropBounding = 3,
    /// `PR_CAP_AMBIENT_CLEAR_ALL`.
    ClearAmbient = 4,
    /// `PR_SET_PDEATHSIG`.
    DeathSignal = 5,
}

impl Step {
    fn from_u8(v: u8) -> Option<Step> {
        Some(match v {
            1 => Step::SplitGid,
            2 => Step::ClearInheritable,
            3 => Step::DropBounding,
            4 => Step::ClearAmbient,
            5 => Step::DeathSignal,
            _ => return None,
        })
    }

    /// The system call of the step.
    pub fn name(self) -> &'static str {
        match self {
            Step::SplitGid => "setresgid",
            Step::ClearInheritable => "capset(inheritable)",
            Step::DropBounding => "prctl(PR_CAPBSET_DROP)",
            Step::ClearAmbient => "prctl(PR_CAP_AMBIENT_CLEAR_ALL)",
            Step::DeathSignal => "prctl(PR_SET_PDEATHSIG)",
        }
    }
}

/// Makes the gateway non-dumpable: the first thing `main` does, before any secret is read and
/// before the first child or helper process starts.
pub fn harden_gateway() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE) only changes a flag of the calling process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process is non-dumpable (what [`harden_gateway`] set).
pub fn gateway_hardened() -> bool {
    // SAFETY: PR_GET_DUMPABLE reads a flag of the calling process.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 0 }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's capability sets (`capget`; async-signal-safe).
fn capget() -> Result<[CapData; CAP_WORDS], i32> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); CAP_WORDS];
    // SAFETY: the header and two data words are what version 3 of capget reads and writes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(errno());
    }
    Ok(data)
}

/// Sets this thread's capability sets (async-signal-safe: one system call; used in `pre_exec`).
fn capset(data: &[CapData; CAP_WORDS]) -> Result<(), i32> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: the header and two data words are what version 3 of capset reads.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    if r != 0 {
        return Err(errno());
    }
    Ok(())
}

fn has_effective(data: &[CapData; CAP_WORDS], cap: u32) -> bool {
    data[(cap / 32) as usize].effective & (1 << (cap % 32)) != 0
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

/// Whether `gid` is mapped in this process's user namespace (`/proc/self/gid_map`; unknown
/// means yes: the kernel then answers for itself at `setresgid`).
fn gid_mapped(gid: libc::gid_t) -> bool {
    let Ok(map) = std::fs::read_to_string("/proc/self/gid_map") else {
        return true;
    };
    map.lines().any(|line| {
        let mut f = line.split_whitespace().map(|v| v.parse::<u64>().ok());
        match (f.next().flatten(), f.next().flatten(), f.next().flatten()) {
            (Some(inside), Some(_), Some(count)) => {
                (inside..inside.saturating_add(count)).contains(&u64::from(gid))
            }
            _ => false,
        }
    })
}

/// The plan for every child of this process, decided on first use (and logged once, at info).
pub fn plan() -> ChildPlan {
    static ANNOUNCED: std::sync::Once = std::sync::Once::new();
    let plan = decided();
    ANNOUNCED.call_once(|| tracing::info!("child process isolation: {}", describe()));
    plan
}

fn decided() -> ChildPlan {
    static PLAN: OnceLock<ChildPlan> = OnceLock::new();
    *PLAN.get_or_init(|| {
        let caps = capget().unwrap_or_default();
        // SAFETY: getegid has no preconditions.
        let egid = unsafe { libc::getegid() };
        let real = if egid == CHILD_REAL_GID {
            CHILD_REAL_GID_ALT
        } else {
            CHILD_REAL_GID
        };
        ChildPlan {
            split_gid: (has_effective(&caps, CAP_SETGID) && gid_mapped(real))
                .then_some((real, egid)),
            drop_bounding: has_effective(&caps, CAP_SETPCAP),
        }
    })
}

/// One line on what children of this gateway can read of each other and of the gateway.
pub fn describe() -> String {
    let plan = decided();
    let gateway = if gateway_hardened() {
        "the gateway is non-dumpable (children cannot read its environ or memory)"
    } else {
        "the gateway is DUMPABLE (children under its uid can read its environ and memory)"
    };
    let children = match plan.split_gid {
        Some((real, _)) => format!(
            "children run non-dumpable (real gid {real}): they cannot read each other's environ or \
             memory (a set-gid exec to the kernel: children ignore LD_*, glibc drops TMPDIR, OpenSSL \
             ignores SSL_CERT_*)"
        ),
        None => "children share the gateway's credentials and are dumpable: a child can read its \
                 siblings' environ and memory (no CAP_SETGID: run children that must not see each \
                 other's credentials in separate gateways, see docs/threat-model.md)"
            .to_string(),
    };
    let caps = if plan.drop_bounding {
        "children hold no capabilities"
    } else {
        "children get no inheritable or ambient capabilities (no CAP_SETPCAP to empty their bounding set)"
    };
    format!("{gateway}; {children}; {caps}")
}

fn fail(step: Step, errno: i32) -> io::Error {
    io::Error::from_raw_os_error(ERROR_MARK | (i32::from(step as u8) << 16) | (errno & 0xffff))
}

/// Applies `plan` in the forked child, then sets the parent-death signal (after the credential
/// change, which would clear it) and checks the parent is still `parent`.
///
/// # Safety
/// Call only between fork and exec (a `pre_exec` closure): it changes the calling process's
/// credentials. It calls only async-signal-safe system calls and does not allocate.
pub unsafe fn apply_in_child(plan: ChildPlan, parent: libc::pid_t) -> io::Result<()> {
    // SAFETY (whole function): plain system calls on the calling process, no memory shared
    // with other threads (the forked child has one thread).
    unsafe {
        if let Some((real, effective)) = plan.split_gid
            && libc::setresgid(real, effective, effective) != 0
        {
            return Err(fail(Step::SplitGid, errno()));
        }
        // Inheritable first: emptying it never needs a capability.
        let mut caps = match capget() {
            Ok(c) => c,
            Err(e) => return Err(fail(Step::ClearInheritable, e)),
        };
        for word in &mut caps {
            word.inheritable = 0;
        }
        if let Err(e) = capset(&caps) {
            return Err(fail(Step::ClearInheritable, e));
        }
        if plan.drop_bounding {
            // Capability numbers are contiguous from 0; the first EINVAL is past the kernel's
            // last capability (/proc/sys/kernel/cap_last_cap).
            for cap in 0..64 as libc::c_ulong {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                    let e = errno();
                    if e == libc::EINVAL && cap > 0 {
                        break;
                    }
                    return Err(fail(Step::DropBounding, e));
                }
            }
        }
        // EINVAL: a kernel before 4.3 has no ambient capabilities (nothing to clear).
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            let e = errno();
            if e != libc::EINVAL {
                return Err(fail(Step::ClearAmbient, e));
            }
        }
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(fail(Step::DeathSignal, errno()));
        }
        // The gateway died between fork and prctl: do not outlive it.
        if libc::getppid() != parent {
            libc::raise(libc::SIGKILL);
        }
    }
    Ok(())
}

/// The failed step and its OS error when a spawn error came from [`apply_in_child`].
pub fn decode_spawn_error(e: &io::Error) -> Option<(Step, io::Error)> {
    let raw = e.raw_os_error()?;
    if raw & ERROR_MARK_MASK != ERROR_MARK {
        return None;
    }
    let step = Step::from_u8(((raw >> 16) & 0xff) as u8)?;
    Some((step, io::Error::from_raw_os_error(raw & 0xffff)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pre_exec_failure_names_its_step_and_errno() {
        let e = fail(Step::DropBounding, libc::EPERM);
        let (step, os) = decode_spawn_error(&e).unwrap();
        assert_eq!(step, Step::DropBounding);
        assert_eq!(os.raw_os_error(), Some(libc::EPERM));
        assert!(decode_spawn_error(&io::Error::from_raw_os_error(libc::ENOENT)).is_none());
    }

    /// A step that fails in the forked child fails the spawn, naming the step: here the
    /// bounding-set drop of a child whose CAP_SETPCAP was taken away just before.
    #[test]
    fn a_failed_step_fails_the_spawn() {
        use std::os::unix::process::CommandExt;
        let caps = capget().unwrap();
        if !has_effective(&caps, CAP_SETPCAP) {
            eprintln!("skipped: no CAP_SETPCAP to take away");
            return;
        }
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let mut cmd = std::process::Command::new("true");
        // SAFETY: capget/capset and apply_in_child are async-signal-safe system calls.
        unsafe {
            cmd.pre_exec(move || {
                let mut caps = capget().map_err(io::Error::from_raw_os_error)?;
                caps[0].effective &= !(1 << CAP_SETPCAP);
                capset(&caps).map_err(io::Error::from_raw_os_error)?;
                let plan = ChildPlan {
                    split_gid: None,
                    drop_bounding: true,
                };
                apply_in_child(plan, parent)
            });
        }
        let err = cmd.spawn().expect_err("the child must not start");
        let (step, os) = decode_spawn_error(&err).expect("an isolation error");
        assert_eq!(step, Step::DropBounding);
        assert_eq!(os.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn the_plan_follows_the_gateways_capabilities() {
        let caps = capget().unwrap();
        let plan = plan();
        assert_eq!(plan.drop_bounding, has_effective(&caps, CAP_SETPCAP));
        assert_eq!(
            plan.split_gid.is_some(),
            has_effective(&caps, CAP_SETGID) && gid_mapped(CHILD_REAL_GID)
        );
        if let Some((real, effective)) = plan.split_gid {
            assert_ne!(
                real, effective,
                "a child must get differing real and effective gids"
            );
        }
    }
}
