//! TLS for the WMS API: a certificate and key from PEM files (a
//! `kubernetes.io/tls` Secret mounted into the pod), re-read when they
//! change, so a rotated certificate (cert-manager, or a Secret edited by
//! hand) is served from the next handshake on without a restart.
//!
//! A rotation that leaves files that do not load (half-written, a key that
//! does not match) keeps the last good certificate and logs a warning; the
//! endpoint never starts without a loadable pair.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use rustls::{
    ServerConfig,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};

/// Where the endpoint's certificate chain and private key are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain (`tls.crt`), leaf first.
    pub cert: PathBuf,
    /// PEM private key (`tls.key`): PKCS#8, PKCS#1 or SEC1.
    pub key: PathBuf,
}

/// Why the certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM.
    #[error(
        "failed to read the WMS API's TLS {what} from {path}: {reason}; mount a kubernetes.io/tls Secret and pass --wms-api-tls-cert/--wms-api-tls-key"
    )]
    Read {
        /// `certificate chain` or `private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The key does not fit the certificate, or rustls refused the pair.
    #[error(
        "the WMS API's TLS key {key} does not fit the certificate {cert}: {source}; check that both come from the same Secret"
    )]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Cause.
        #[source]
        source: rustls::Error,
    },
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads and checks the pair.
fn load(files: &TlsFiles, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let read = |what: &'static str, path: &Path, reason: String| TlsError::Read {
        what,
        path: path.to_owned(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| read("certificate chain", &files.cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| read("certificate chain", &files.cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(read(
            "certificate chain",
            &files.cert,
            "no CERTIFICATE block".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| read("private key", &files.key, e.to_string()))?;
    let pair = |source| TlsError::Pair {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    };
    let signing = provider.key_provider.load_private_key(key).map_err(pair)?;
    let certified = CertifiedKey::new(certs, signing);
    certified.keys_match().map_err(pair)?;
    Ok(certified)
}

/// The files' modification times (a change of either reloads both).
fn stamp(files: &TlsFiles) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(&files.cert)?, m(&files.key)?))
}

struct Current {
    stamp: Option<(SystemTime, SystemTime)>,
    key: Arc<CertifiedKey>,
}

/// Serves the pair in `files`, re-read at a handshake after either file changed.
pub struct ReloadingCert {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: Mutex<Current>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Loads the pair now: an unloadable pair is an error, not an endpoint without TLS.
    pub fn new(files: TlsFiles) -> Result<ReloadingCert, TlsError> {
        let provider = provider();
        let stamp = stamp(&files);
        let key = Arc::new(load(&files, &provider)?);
        Ok(ReloadingCert {
            files,
            provider,
            current: Mutex::new(Current { stamp, key }),
        })
    }

    /// The pair to present now, reloading it first when the files changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut current = match self.current.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        let now = stamp(&self.files);
        if now.is_some() && now != current.stamp {
            match load(&self.files, &self.provider) {
                Ok(key) => {
                    tracing::info!(cert = %self.files.cert.display(), "the WMS API's TLS certificate changed: serving the new one");
                    current.key = Arc::new(key);
                    current.stamp = now;
                }
                Err(e) => {
                    // Keep the last good pair; try again at the next handshake.
                    tracing::warn!(error = %e, "the WMS API keeps its previous TLS certificate");
                }
            }
        }
        current.key.clone()
    }

    /// A rustls server configuration presenting this certificate (HTTP/1.1 only, no client
    /// certificates: callers authenticate with bearer tokens).
    pub fn server_config(self: Arc<Self>) -> Result<ServerConfig, TlsError> {
        let provider = self.provider.clone();
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Pair {
                cert: self.files.cert.clone(),
                key: self.files.key.clone(),
                source,
            })?
            .with_no_client_auth()
            .with_cert_resolver(self);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::process::Command;

    use super::*;

    fn openssl(args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A test CA in `dir` (`ca.crt`, `ca.key`), made once per directory.
    pub(crate) fn ca(dir: &Path) -> PathBuf {
        let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        if !crt.exists() {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=protobot-test-ca",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout",
                key.to_str().unwrap(),
                "-out",
                crt.to_str().unwrap(),
            ]);
        }
        crt
    }

    /// A server pair for 127.0.0.1 named `name`, issued by [`ca`] of `dir`.
    pub(crate) fn self_signed(dir: &Path, name: &str) -> TlsFiles {
        let ca_crt = ca(dir);
        let ca_key = dir.join("ca.key");
        let files = TlsFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        let csr = dir.join(format!("{name}.csr"));
        let ext = dir.join(format!("{name}.ext"));
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            files.key.to_str().unwrap(),
            "-out",
            csr.to_str().unwrap(),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            csr.to_str().unwrap(),
            "-CA",
            ca_crt.to_str().unwrap(),
            "-CAkey",
            ca_key.to_str().unwrap(),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            ext.to_str().unwrap(),
            "-out",
            files.cert.to_str().unwrap(),
        ]);
        files
    }

    #[test]
    fn a_missing_file_or_a_key_of_another_certificate_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = self_signed(dir.path(), "a");
        let b = self_signed(dir.path(), "b");
        let missing = TlsFiles {
            cert: dir.path().join("nope.crt"),
            key: a.key.clone(),
        };
        let e = ReloadingCert::new(missing).unwrap_err().to_string();
        assert!(
            e.contains("nope.crt") && e.contains("certificate chain"),
            "{e}"
        );
        let crossed = TlsFiles {
            cert: a.cert.clone(),
            key: b.key.clone(),
        };
        let e = ReloadingCert::new(crossed).unwrap_err().to_string();
        assert!(e.contains("does not fit"), "{e}");
        std::fs::write(dir.path().join("empty.crt"), "not pem").unwrap();
        let empty = TlsFiles {
            cert: dir.path().join("empty.crt"),
            key: a.key.clone(),
        };
        assert!(ReloadingCert::new(empty).is_err());
        assert!(ReloadingCert::new(a).is_ok());
    }

    #[test]
    fn a_rotated_pair_is_served_and_a_broken_rotation_keeps_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let live = TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let first = self_signed(dir.path(), "first");
        let second = self_signed(dir.path(), "second");
        let install = |from: &TlsFiles| {
            std::fs::copy(&from.cert, &live.cert).unwrap();
            std::fs::copy(&from.key, &live.key).unwrap();
        };
        install(&first);
        let resolver = ReloadingCert::new(live.clone()).unwrap();
        let served = |r: &ReloadingCert| r.current().cert[0].as_ref().to_vec();
        let first_der = served(&resolver);
        install(&second);
        // Modification times have a coarse grain on some filesystems: set one that differs.
        let bump = |p: &Path| {
            let f = std::fs::File::options().append(true).open(p).unwrap();
            f.set_modified(SystemTime::now() + std::time::Duration::from_secs(5))
                .unwrap();
        };
        bump(&live.cert);
        let second_der = served(&resolver);
        assert_ne!(first_der, second_der, "the rotated certificate is served");
        std::fs::write(&live.key, "-----BEGIN PRIVATE KEY-----\ngarbage\n").unwrap();
        let f = std::fs::File::options()
            .append(true)
            .open(&live.key)
            .unwrap();
        f.set_modified(SystemTime::now() + std::time::Duration::from_secs(10))
            .unwrap();
        assert_eq!(
            served(&resolver),
            second_der,
            "a broken rotation keeps the last good pair"
        );
    }
}
