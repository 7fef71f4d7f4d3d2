//! A redis-server that also listens with TLS, with a private CA made for the test.
//!
//! [`TlsRedisServer::start`] makes a CA and a server certificate for `127.0.0.1` and
//! `localhost` (rcgen, in memory), and starts a server whose plain port stays open for the
//! harness ([`TlsRedisServer::server`]) while clients use the TLS port
//! ([`TlsRedisServer::url`], `rediss://`) and trust [`TlsRedisServer::ca_pem`].

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};

use crate::{RedisServer, free_port};

/// A private CA and a certificate it signed for `127.0.0.1` and `localhost`, written to a
/// temporary directory (removed when dropped) for redis-server to read.
#[derive(Debug)]
pub struct TestCertificates {
    cert_file: String,
    key_file: String,
    ca_file: String,
    ca_pem: String,
    _files: tempfile::TempDir,
}

impl TestCertificates {
    /// Makes the CA and the server certificate (rcgen, in memory) and writes them out.
    ///
    /// # Panics
    ///
    /// If a certificate cannot be made or written.
    pub fn make() -> Self {
        let files = tempfile::Builder::new()
            .prefix("leasehold-tls-")
            .tempdir()
            .expect("a temporary directory");
        let ca = {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(DnType::CommonName, "leasehold test CA");
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a CA key"))
                .expect("a CA certificate")
        };
        let key = KeyPair::generate().expect("a server key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let cert = params.signed_by(&key, &ca).expect("a server certificate");
        let write = |name: &str, text: &str| {
            let path = files.path().join(name);
            std::fs::write(&path, text).expect("writing a certificate file");
            path.to_string_lossy().into_owned()
        };
        Self {
            cert_file: write("server.crt", &cert.pem()),
            key_file: write("server.key", &key.serialize_pem()),
            ca_file: write("ca.crt", &ca.pem()),
            ca_pem: ca.pem(),
            _files: files,
        }
    }

    /// The redis-server arguments that open `tls_port` with this certificate, clients not
    /// asked for one of their own.
    pub fn server_args(&self, tls_port: u16) -> Vec<String> {
        [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &self.cert_file,
            "--tls-key-file",
            &self.key_file,
            "--tls-ca-cert-file",
            &self.ca_file,
            "--tls-auth-clients",
            "no",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Returns the CA certificate (PEM) the server certificate chains to.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
}

/// A server with a TLS port and the CA its certificate chains to.
#[derive(Debug)]
pub struct TlsRedisServer {
    server: RedisServer,
    tls_port: u16,
    certificates: TestCertificates,
}

impl TlsRedisServer {
    /// Makes the certificates and starts the server.
    ///
    /// # Panics
    ///
    /// If redis-server is missing (with an install hint), was built without TLS, or does not
    /// start; or if a certificate cannot be made.
    pub fn start() -> Self {
        let certificates = TestCertificates::make();
        let mut last_error = String::new();
        for _ in 0..5 {
            let tls_port = free_port();
            let args = certificates.server_args(tls_port);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match RedisServer::try_start_with_args(&args) {
                Ok(server) => {
                    return Self {
                        server,
                        tls_port,
                        certificates,
                    };
                }
                Err(e) => last_error = e,
            }
        }
        panic!("a TLS redis-server did not start: {last_error}");
    }

    /// Returns `rediss://127.0.0.1:TLS_PORT`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }

    /// Returns the CA certificate (PEM) the server's certificate chains to.
    pub fn ca_pem(&self) -> &str {
        self.certificates.ca_pem()
    }

    /// Returns the server, for harness commands on its plain port.
    pub fn server(&self) -> &RedisServer {
        &self.server
    }
}
