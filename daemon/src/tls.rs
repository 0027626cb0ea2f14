//! rustls' process-wide crypto provider: ring (aws-lc would need cmake and minutes of C
//! build on 2 cores). Every HTTPS client and server of a Rigger process calls this first.

/// Install ring as the process's crypto provider, once.
pub fn install_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Err only means another provider is already installed, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
