//! rustls client configurations from named TLS profiles (parsed from the fleet by `config::tls`): CA bundle
//! replacing or extending the system roots, client certificate + key (mTLS), minimum version.
//! The SNI/server-name override is applied by the HTTP transport (the connection goes to the
//! URL host's admitted addresses, TLS speaks to the override name).

use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a profile's CA bundle combines with the platform's trust store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CaMode {
    /// Trust only the profile's CA bundle (default).
    #[default]
    Replace,
    /// Trust the system roots and the profile's CA bundle.
    Extend,
}

/// Lowest TLS version a profile negotiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum TlsVersion {
    /// TLS 1.2 (default).
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3.
    #[serde(rename = "1.3")]
    Tls13,
}

/// What a client trusts and presents: a named TLS profile with its certificates loaded (the
/// fleet's `tlsProfiles` build one per profile; `--vault-ca-file` builds one for Vault).
#[derive(Debug, Clone, Copy)]
pub struct Trust<'a> {
    /// Profile name (named in errors).
    pub name: &'a str,
    /// CA certificates (DER); empty = the platform's trust store only.
    pub ca: &'a [CertificateDer<'static>],
    /// How `ca` combines with the system roots.
    pub ca_mode: CaMode,
    /// Client certificate chain (DER) for mTLS.
    pub client_cert: &'a [CertificateDer<'static>],
    /// Lowest TLS version.
    pub min_version: TlsVersion,
}

/// A TLS profile that cannot make a client configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TLS profile '{profile}': {reason}")]
pub struct TlsError {
    /// Profile name.
    pub profile: String,
    /// What is wrong (never key material).
    pub reason: String,
}

/// Largest CA bundle or certificate chain accepted (bytes).
pub const MAX_PEM_BYTES: usize = 1 << 20;

/// The bytes of a PEM file, bounded by [`MAX_PEM_BYTES`], or why not (a fleet's `caFile`,
/// `--vault-ca-file`).
pub fn read_pem_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() as usize > MAX_PEM_BYTES => Err("file is larger than 1 MiB".into()),
        Ok(_) => std::fs::read(path).map_err(|e| format!("cannot read the file: {}", e.kind())),
        Err(e) => Err(format!("cannot read the file: {}", e.kind())),
    }
}

/// The certificates of PEM text: at least one `CERTIFICATE` block, or why not.
pub fn pem_certificates(text: &[u8]) -> Result<Vec<CertificateDer<'static>>, &'static str> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(text).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(c),
        Ok(_) => Err("holds no PEM CERTIFICATE block"),
        Err(_) => Err("is not valid PEM"),
    }
}

/// The platform's trust store, loaded once.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        if !found.errors.is_empty() {
            tracing::debug!(
                errors = found.errors.len(),
                "some system CA certificates could not be read"
            );
        }
        found.certs
    })
}

/// The rustls configuration of `profile`; `client_key_pem` is its resolved client key.
pub fn client_config(
    profile: &Trust<'_>,
    client_key_pem: Option<&str>,
) -> Result<rustls::ClientConfig, TlsError> {
    super::crypto::install_crypto();
    let err = |reason: &str| TlsError {
        profile: profile.name.to_string(),
        reason: reason.to_string(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    if profile.ca.is_empty() || profile.ca_mode == CaMode::Extend {
        roots.add_parsable_certificates(system_roots().iter().cloned());
    }
    for cert in profile.ca {
        roots
            .add(cert.clone())
            .map_err(|_| err("a CA certificate is not usable as a trust anchor"))?;
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|_| err("no usable CA certificate"))?;
    let versions: &[&'static rustls::SupportedProtocolVersion] = match profile.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|_| err("the TLS versions are not supported"))?
        .with_webpki_verifier(verifier);
    let mut config = match (&profile.client_cert.is_empty(), client_key_pem) {
        (true, _) => builder.with_no_client_auth(),
        (false, None) => return Err(err("the client key did not resolve")),
        (false, Some(pem)) => {
            // Never echo the key (or any part of it) in an error.
            let key = PrivateKeyDer::from_pem_slice(pem.as_bytes())
                .map_err(|_| err("the client key is not a PEM private key"))?;
            builder
                .with_client_auth_cert(profile.client_cert.to_vec(), key)
                .map_err(|_| err("the client key does not match the client certificate"))?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The stable code of a TLS failure somewhere in an error's source chain.
pub fn classify(err: &(dyn std::error::Error + 'static)) -> Option<(&'static str, String)> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        // io::Error hides its payload from `source()` (it returns the payload's source): look
        // inside with `get_ref`, through any nesting of io::Errors.
        let mut inner: &(dyn std::error::Error + 'static) = e;
        loop {
            if let Some(t) = inner.downcast_ref::<rustls::Error>() {
                return Some(describe(t));
            }
            match inner
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(payload) => inner = payload,
                None => break,
            }
        }
        cur = e.source();
    }
    None
}

fn describe(e: &rustls::Error) -> (&'static str, String) {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::InvalidCertificate(c) => (
            "tls-certificate-invalid",
            format!("the server certificate is not trusted: {c:?}"),
        ),
        rustls::Error::AlertReceived(
            a @ (A::CertificateRequired
            | A::BadCertificate
            | A::UnknownCA
            | A::AccessDenied
            | A::CertificateUnknown
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::UnsupportedCertificate),
        ) => (
            "tls-client-certificate-refused",
            format!("the server refused the client certificate (alert {a:?})"),
        ),
        other => (
            "tls-handshake-failed",
            format!("TLS handshake failed: {other}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tls_failures_are_found_through_nested_io_errors() {
        let inner = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let outer = std::io::Error::other(inner);
        assert_eq!(
            super::classify(&outer).map(|c| c.0),
            Some("tls-certificate-invalid")
        );
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        assert_eq!(
            super::classify(&alert).map(|c| c.0),
            Some("tls-client-certificate-refused")
        );
        assert_eq!(super::classify(&std::io::Error::other("x")), None);
    }
}
