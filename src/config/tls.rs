//! Named TLS profiles: the top-level `tlsProfiles` map of a fleet document (file or McpFleet
//! spec) and their validation. An entry's `tlsProfile` must name one of them.
//!
//! ```json
//! {"tlsProfiles": {"internal": {
//!     "caFile": "/etc/graph-os/internal-ca.pem",      // or "caPem": "-----BEGIN CERTIFICATE-----…"
//!     "caMode": "replace",                             // or "extend" (system roots + this CA)
//!     "clientCertFile": "/etc/graph-os/client.pem",    // or "clientCertPem"
//!     "clientKey": "secret://mcp/client-tls#tls.key",  // a reference, never a literal key
//!     "minVersion": "1.3",                             // "1.2" (default) or "1.3"
//!     "serverName": "mcp.internal"                     // SNI and certificate name override
//! }}}
//! ```
//!
//! Files are read when the fleet is loaded (a changed file changes the child declaration, so a
//! reload reconnects the children that use it); the client key is a secret reference resolved
//! at the child boundary like any header.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigIssue, issue};
use crate::net::tls::{CaMode, MAX_PEM_BYTES, TlsVersion, Trust, pem_certificates, read_pem_file};
use crate::secrets::SecretValue;

/// Most profiles in one document.
const MAX_PROFILES: usize = 64;

/// One entry of `tlsProfiles` as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsProfileSpec {
    /// PEM file of CA certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// PEM text of CA certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    /// `replace` (default: trust only this CA bundle) or `extend` (system roots plus it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_mode: Option<CaMode>,
    /// PEM file of the client certificate chain (mTLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_file: Option<String>,
    /// PEM text of the client certificate chain (mTLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_pem: Option<String>,
    /// The client's private key (PEM) as a secret reference: `secret://`, `vault://`, `env://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<String>,
    /// Lowest TLS version: `1.2` (default) or `1.3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_version: Option<TlsVersion>,
    /// Name sent as SNI and verified in the server certificate instead of the URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

/// A validated TLS profile, ready for a connection (certificates already loaded).
#[derive(Debug, Clone, PartialEq)]
pub struct TlsProfile {
    /// Profile name.
    pub name: String,
    /// CA certificates (DER); empty = the platform's trust store only.
    pub ca: Vec<CertificateDer<'static>>,
    /// How `ca` combines with the system roots.
    pub ca_mode: CaMode,
    /// Client certificate chain (DER) for mTLS.
    pub client_cert: Vec<CertificateDer<'static>>,
    /// Client key reference (resolved at the child boundary).
    pub client_key: Option<SecretValue>,
    /// Lowest TLS version.
    pub min_version: TlsVersion,
    /// SNI / certificate name override.
    pub server_name: Option<String>,
}

impl TlsProfile {
    /// What a client of this profile trusts and presents.
    pub fn trust(&self) -> Trust<'_> {
        Trust {
            name: &self.name,
            ca: &self.ca,
            ca_mode: self.ca_mode,
            client_cert: &self.client_cert,
            min_version: self.min_version,
        }
    }

    /// The secret references this profile needs at connect time.
    pub fn secret_values(&self) -> impl Iterator<Item = &SecretValue> {
        self.client_key.iter()
    }
}

/// Validated profiles by name.
pub type TlsProfiles = BTreeMap<String, Arc<TlsProfile>>;

fn valid_profile_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Reads PEM certificates from a file or inline text (exactly one of the two).
fn certificates(
    field: &str,
    file: Option<&str>,
    pem: Option<&str>,
    profile: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Vec<CertificateDer<'static>> {
    let at = format!("tlsProfiles.{profile}.{field}");
    let text: Vec<u8> = match (file, pem) {
        (None, None) => return vec![],
        (Some(_), Some(_)) => {
            issues.push(issue("", &at, "give a file or inline PEM, not both"));
            return vec![];
        }
        (Some(path), None) => match read_pem_file(std::path::Path::new(path)) {
            Ok(b) => b,
            Err(why) => {
                issues.push(issue("", &at, &why));
                return vec![];
            }
        },
        (None, Some(text)) => {
            if text.len() > MAX_PEM_BYTES {
                issues.push(issue("", &at, "PEM text is larger than 1 MiB"));
                return vec![];
            }
            text.as_bytes().to_vec()
        }
    };
    match pem_certificates(&text) {
        Ok(c) => c,
        Err(why) => {
            issues.push(issue("", &at, why));
            vec![]
        }
    }
}

/// PEM text of DER certificates.
fn pem_of(certs: &[CertificateDer<'static>]) -> Vec<u8> {
    use base64::Engine;
    let mut out = String::new();
    for c in certs {
        let b64 = base64::engine::general_purpose::STANDARD.encode(c.as_ref());
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

/// The TLS material for a `rediss://` session store from a file holding one profile in the
/// `tlsProfiles` format (JSON or YAML). The CA replaces the system roots (the Redis client
/// cannot extend them); `minVersion` and `serverName` are refused rather than ignored.
pub async fn redis_certificates(path: &std::path::Path) -> anyhow::Result<redis::TlsCertificates> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--session-store-tls-profile {}: {e}", path.display()))?;
    let value: serde_json::Value = serde_saphyr::from_str(&text)
        .map_err(|e| anyhow::anyhow!("--session-store-tls-profile: not JSON or YAML: {e}"))?;
    let mut issues = Vec::new();
    let profiles = parse_profiles(
        Some(&serde_json::json!({ "session-store": value })),
        &mut issues,
    );
    let Some(profile) = profiles.get("session-store").filter(|_| issues.is_empty()) else {
        let problems: Vec<String> = issues.iter().map(|i| i.to_string()).collect();
        anyhow::bail!("--session-store-tls-profile: {}", problems.join("; "));
    };
    if profile.server_name.is_some() || profile.min_version != TlsVersion::default() {
        anyhow::bail!(
            "--session-store-tls-profile: serverName and minVersion are not supported for the session store"
        );
    }
    if profile.ca_mode == CaMode::Extend {
        anyhow::bail!(
            "--session-store-tls-profile: caMode extend is not supported for the session store (its CA replaces the system roots)"
        );
    }
    let client_tls = match (&profile.client_key, profile.client_cert.is_empty()) {
        (None, true) => None,
        (Some(key), false) => {
            let prefetched = crate::secrets::prefetch(std::iter::once(key)).await;
            let key = key
                .resolve_material(&crate::secrets::lookup_with(&prefetched))
                .map_err(|e| anyhow::anyhow!("--session-store-tls-profile clientKey: {e}"))?;
            Some(redis::ClientTlsConfig {
                client_cert: pem_of(&profile.client_cert),
                client_key: key.into_bytes(),
            })
        }
        _ => anyhow::bail!(
            "--session-store-tls-profile: mTLS needs both a client certificate and clientKey"
        ),
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert: (!profile.ca.is_empty()).then(|| pem_of(&profile.ca)),
    })
}

/// Validates the top-level `tlsProfiles` value (absent = none). Problems name the profile and
/// field (server `""`); a bad profile is left out, so entries naming it are refused.
pub fn parse_profiles(
    value: Option<&serde_json::Value>,
    issues: &mut Vec<ConfigIssue>,
) -> TlsProfiles {
    let mut out = TlsProfiles::new();
    let Some(value) = value else { return out };
    let Some(map) = value.as_object() else {
        issues.push(issue(
            "",
            "tlsProfiles",
            "must be an object mapping profile names to profiles",
        ));
        return out;
    };
    if map.len() > MAX_PROFILES {
        issues.push(issue(
            "",
            "tlsProfiles",
            &format!("more than {MAX_PROFILES} profiles"),
        ));
        return out;
    }
    for (name, raw) in map {
        let at = format!("tlsProfiles.{name}");
        if !valid_profile_name(name) {
            issues.push(issue(
                "",
                &at,
                "profile names must match [A-Za-z0-9_.-]{1,64}",
            ));
            continue;
        }
        let spec: TlsProfileSpec = match serde_json::from_value(raw.clone()) {
            Ok(s) => s,
            Err(e) => {
                issues.push(issue("", &at, &super::spec::describe_serde_error(&e)));
                continue;
            }
        };
        let before = issues.len();
        let ca = certificates(
            "caFile",
            spec.ca_file.as_deref(),
            spec.ca_pem.as_deref(),
            name,
            issues,
        );
        if spec.ca_mode.is_some() && spec.ca_file.is_none() && spec.ca_pem.is_none() {
            issues.push(issue("", &format!("{at}.caMode"), "needs caFile or caPem"));
        }
        let client_cert = certificates(
            "clientCertFile",
            spec.client_cert_file.as_deref(),
            spec.client_cert_pem.as_deref(),
            name,
            issues,
        );
        let client_key = match spec.client_key.as_deref().map(SecretValue::parse) {
            None => None,
            Some(Ok(v)) if v.is_bare_reference() => Some(v),
            Some(Ok(_)) => {
                issues.push(issue(
                    "",
                    &format!("{at}.clientKey"),
                    "must be one secret reference (secret://, vault://, env://NAME or ${NAME}), never key material",
                ));
                None
            }
            Some(Err(e)) => {
                issues.push(issue("", &format!("{at}.clientKey"), &e.to_string()));
                None
            }
        };
        if client_cert.is_empty() != client_key.is_none() && issues.len() == before {
            issues.push(issue(
                "",
                &format!("{at}.clientKey"),
                "a client certificate and a client key go together",
            ));
        }
        if let Some(sni) = &spec.server_name
            && rustls_pki_types::ServerName::try_from(sni.as_str()).is_err()
        {
            issues.push(issue(
                "",
                &format!("{at}.serverName"),
                "is not a valid DNS name or IP address",
            ));
        }
        if issues.len() > before {
            continue;
        }
        out.insert(
            name.clone(),
            Arc::new(TlsProfile {
                name: name.clone(),
                ca,
                ca_mode: spec.ca_mode.unwrap_or_default(),
                client_cert,
                client_key,
                min_version: spec.min_version.unwrap_or_default(),
                server_name: spec.server_name.clone(),
            }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn profiles_are_validated_field_by_field() {
        let mut issues = vec![];
        let p = parse_profiles(
            Some(&json!({
                "ok": {"minVersion": "1.3", "serverName": "mcp.internal"},
                "badpem": {"caPem": "not pem"},
                "both": {"caPem": "x", "caFile": "/nope"},
                "literalkey": {"clientCertPem": "x", "clientKey": "-----BEGIN PRIVATE KEY-----"},
                "nofile": {"caFile": "/definitely/not/here.pem"},
                "typo": {"caFiel": "/x"},
                "sni": {"serverName": "bad name!"},
            })),
            &mut issues,
        );
        assert_eq!(p.keys().collect::<Vec<_>>(), vec!["ok"]);
        let fields: Vec<&str> = issues.iter().map(|i| i.field.as_str()).collect();
        for f in [
            "tlsProfiles.badpem.caFile",
            "tlsProfiles.both.caFile",
            "tlsProfiles.literalkey.clientKey",
            "tlsProfiles.nofile.caFile",
            "tlsProfiles.typo",
            "tlsProfiles.sni.serverName",
        ] {
            assert!(fields.contains(&f), "{f} not in {fields:?}");
        }
        let text: String = issues.iter().map(|i| i.to_string()).collect();
        assert!(!text.contains("BEGIN PRIVATE KEY"), "{text}");
        assert_eq!(p["ok"].min_version, TlsVersion::Tls13);
    }
}
