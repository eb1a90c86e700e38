//! The process-wide rustls crypto provider (a leaf: every TLS and egress client calls it).

/// Installs the process-wide rustls crypto provider (ring). Idempotent.
pub fn install_crypto() {
    static ONCE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
