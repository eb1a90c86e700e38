//! The network ground floor: the egress policy every outbound connection passes ([`egress`]),
//! rustls client configurations ([`tls`]) and the process-wide crypto provider ([`crypto`]).
//! Imports nothing of the crate: configuration, secrets backends, child transports and the
//! OAuth client all build on it.

pub mod crypto;
pub mod egress;
pub mod tls;

/// The stable code of an HTTP client error that is more than "connection failed": an egress
/// refusal (`egress-denied`) or a TLS failure (`tls-certificate-invalid`,
/// `tls-client-certificate-refused`, `tls-handshake-failed`).
pub fn classify_error(err: &(dyn std::error::Error + 'static)) -> Option<(&'static str, String)> {
    if let Some(d) = egress::denied_in(err) {
        return Some((d.code(), d.to_string()));
    }
    tls::classify(err)
}
