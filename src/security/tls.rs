//! TLS for SSL and SASL_SSL listeners, with rustls (no OpenSSL in the broker).
//!
//! Kafka's PEM settings: `ssl.keystore.location` is one PEM file holding the private key
//! (PKCS#8, PKCS#1 or SEC1, unencrypted) and the certificate chain, leaf first;
//! `ssl.truststore.location` holds the CA certificates client certificates are checked
//! against; `ssl.client.auth` is `none`, `requested` or `required`.
//!
//! Reload without restart: `TlsServer` keeps the current rustls config behind an
//! `ArcSwap`, which accepts read without a lock. `TlsServer::reload_if_changed` (called
//! off the data cores, by the broker's TLS watcher thread) rebuilds it when a file's
//! modification time or size moves; a file that no longer parses keeps the old config
//! and is logged. Connections keep the config they were accepted with.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// ssl.client.auth
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    Requested,
    Required,
}

impl ClientAuth {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(ClientAuth::None),
            "requested" => Some(ClientAuth::Requested),
            "required" => Some(ClientAuth::Required),
            _ => None,
        }
    }
}

/// The files and choices a TLS listener is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub keystore: PathBuf,
    pub truststore: Option<PathBuf>,
    pub client_auth: ClientAuth,
}

/// What identifies a version of the files: (modified, length) of each.
type FilesStamp = Vec<Option<(SystemTime, u64)>>;

fn stamp(settings: &TlsSettings) -> FilesStamp {
    std::iter::once(&settings.keystore)
        .chain(settings.truststore.as_ref())
        .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len()))))
        .collect()
}

/// A TLS listener's current server config, reloadable.
pub struct TlsServer {
    settings: TlsSettings,
    current: ArcSwap<ServerConfig>,
    stamp: std::sync::Mutex<FilesStamp>,
}

impl TlsServer {
    /// Load the files; an error names the file and what is wrong with it.
    pub fn load(settings: TlsSettings) -> Result<Self, String> {
        let stamp = stamp(&settings);
        let config = build(&settings)?;
        Ok(TlsServer { settings, current: ArcSwap::from_pointee(config), stamp: std::sync::Mutex::new(stamp) })
    }

    /// The config new connections are accepted with (no lock).
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    pub fn settings(&self) -> &TlsSettings {
        &self.settings
    }

    /// Rebuild the config if the files changed since the last load. Ok(true): reloaded.
    /// On an error the old config stays in use. Called by one watcher thread only.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let now = stamp(&self.settings);
        let mut last = self.stamp.lock().unwrap_or_else(|p| p.into_inner());
        if *last == now {
            return Ok(false);
        }
        *last = now;
        let config = build(&self.settings)?;
        self.current.store(Arc::new(config));
        Ok(true)
    }
}

pub(super) fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() > crate::model::limits::tls_pem_file_bytes_max {
        return Err(format!(
            "{} is {} bytes, more than {} a PEM file may hold",
            path.display(),
            bytes.len(),
            crate::model::limits::tls_pem_file_bytes_max
        ));
    }
    Ok(bytes)
}

pub(super) fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: bad PEM certificate: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

fn build(settings: &TlsSettings) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let keystore = read_pem(&settings.keystore)?;
    let chain = certificates(&settings.keystore, &keystore)?;
    let key = PrivateKeyDer::from_pem_slice(&keystore).map_err(|e| {
        format!("{}: no unencrypted private key (PKCS#8, PKCS#1 or SEC1): {e}", settings.keystore.display())
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match (settings.client_auth, &settings.truststore) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => return Err("ssl.client.auth needs ssl.truststore.location".into()),
        (auth, Some(path)) => {
            let pem = read_pem(path)?;
            let mut roots = RootCertStore::empty();
            for cert in certificates(path, &pem)? {
                roots.add(cert).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::Requested { verifier.allow_unauthenticated() } else { verifier };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| format!("TLS: {e}"))?)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{}: the key does not fit the certificate: {e}", settings.keystore.display()))?;
    config.alpn_protocols.clear();
    Ok(config)
}

/// The subject of a client certificate, the distinguished name in RFC 2253 form (most
/// specific first, `CN=client,OU=test,O=spate`) that `ssl.principal.mapping.rules` maps
/// to a principal's name. A certificate that does not parse (rustls has verified it, so
/// this is unexpected) gives None.
pub fn certificate_subject(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let mut rdns: Vec<String> = Vec::new();
    for rdn in cert.subject().iter() {
        let attrs: Vec<String> = rdn
            .iter()
            .map(|a| {
                let oid = a.attr_type();
                let name = x509_parser::objects::oid2abbrev(oid, x509_parser::objects::oid_registry())
                    .map(str::to_string)
                    .unwrap_or_else(|_| oid.to_id_string());
                let value = a.as_str().map(escape_rfc2253).unwrap_or_default();
                format!("{name}={value}")
            })
            .collect();
        rdns.push(attrs.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// RFC 2253 escaping of an attribute value.
fn escape_rfc2253(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == ' ' || c == '#'))
            || (i + 1 == v.chars().count() && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc2253_escapes_what_it_must() {
        assert_eq!(escape_rfc2253("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape_rfc2253(" lead"), "\\ lead");
        assert_eq!(escape_rfc2253("plain"), "plain");
    }

    #[test]
    fn missing_and_malformed_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing =
            TlsSettings { keystore: dir.path().join("nope.pem"), truststore: None, client_auth: ClientAuth::None };
        assert!(TlsServer::load(missing).err().unwrap().contains("nope.pem"));
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n").unwrap();
        let settings = TlsSettings { keystore: junk, truststore: None, client_auth: ClientAuth::None };
        assert!(TlsServer::load(settings).err().unwrap().contains("junk.pem"));
    }
}
