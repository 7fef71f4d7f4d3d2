//! The redis-rs clients a deployment's connections are made with, TLS roots applied: a leaf
//! that the backend's constructors (`topology`) and the release-notice subscriber (`notices`)
//! both use, so that neither depends on the other for it.

/// A cluster client builder for `seeds`, trusting `roots` (PEM) in place of the system's
/// store when the seeds are `rediss://`; the roots are ignored for plain seeds, which
/// redis-rs would otherwise switch to TLS.
pub(crate) fn cluster_builder(
    seeds: Vec<redis::ConnectionInfo>,
    roots: Option<&[u8]>,
) -> redis::cluster::ClusterClientBuilder {
    let tls = seeds
        .iter()
        .any(|seed| matches!(seed.addr(), redis::ConnectionAddr::TcpTls { .. }));
    let builder = redis::cluster::ClusterClientBuilder::new(seeds);
    if tls {
        tls_cluster_builder(builder, roots)
    } else {
        builder
    }
}

#[cfg(feature = "tls")]
fn tls_cluster_builder(
    builder: redis::cluster::ClusterClientBuilder,
    roots: Option<&[u8]>,
) -> redis::cluster::ClusterClientBuilder {
    install_crypto_provider();
    match roots {
        None => builder,
        Some(pem) => builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        }),
    }
}

/// Without the `tls` feature, TLS seeds are refused before a builder is made.
#[cfg(not(feature = "tls"))]
fn tls_cluster_builder(
    builder: redis::cluster::ClusterClientBuilder,
    _: Option<&[u8]>,
) -> redis::cluster::ClusterClientBuilder {
    builder
}

/// rustls needs a process-wide crypto provider; ring is the one compiled in. An error only
/// means one was installed already, which serves as well.
#[cfg(feature = "tls")]
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
