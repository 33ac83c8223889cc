//! TLS for SSL and SASL_SSL listeners, with rustls (no OpenSSL in the broker).
//!
//! Kafka's PEM settings: `ssl.keystore.location` is one PEM file holding the private key
//! and the certificate chain, leaf first. The key is PKCS#8, PKCS#1 or SEC1, or an
//! encrypted PKCS#8 key (`ENCRYPTED PRIVATE KEY`, PBES2 with PBKDF2 or scrypt and AES-CBC,
//! as `openssl pkcs8 -topk8` writes it) opened with `ssl.key.password`, as Kafka's PEM
//! key stores read it;
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
    /// ssl.key.password: opens an encrypted private key in the keystore.
    pub key_password: Option<String>,
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

pub(crate) fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: bad PEM certificate: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

const ENCRYPTED_KEY_LABEL: &str = "ENCRYPTED PRIVATE KEY";

/// What an encrypted key's derivation may cost: its PBKDF2 iterations and scrypt memory.
#[derive(Clone, Copy, Debug)]
pub struct KdfLimits {
    pub pbkdf2_iterations_max: u32,
    pub scrypt_bytes_max: u64,
}

impl KdfLimits {
    /// The broker's and the CLI's: the named limits.
    pub const NAMED: KdfLimits = KdfLimits {
        pbkdf2_iterations_max: crate::model::limits::tls_key_pbkdf2_iterations_max,
        scrypt_bytes_max: crate::model::limits::tls_key_scrypt_bytes_max,
    };
}

/// The private key of a PEM key store. An encrypted PKCS#8 key is decrypted with
/// `password` (Kafka's `ssl.key.password`) after its key derivation's cost is checked
/// against the named limits; otherwise the first unencrypted key (PKCS#8, PKCS#1 or
/// SEC1) is taken. OpenSSL's legacy encrypted PEM (`Proc-Type: 4,ENCRYPTED`), which
/// Kafka does not read either, is refused with how to convert it.
pub(super) fn private_key(path: &Path, pem: &[u8], password: Option<&str>) -> Result<PrivateKeyDer<'static>, String> {
    private_key_within(path, pem, password, KdfLimits::NAMED)
}

/// `private_key` with the key derivation's cost bounded by `limits` (the fuzz target's
/// are small, so that each input stays quick).
pub(crate) fn private_key_within(
    path: &Path,
    pem: &[u8],
    password: Option<&str>,
    limits: KdfLimits,
) -> Result<PrivateKeyDer<'static>, String> {
    let at = path.display();
    if let Some(section) = pem_section(pem, ENCRYPTED_KEY_LABEL) {
        let password = password.ok_or_else(|| format!("{at}: the private key is encrypted; set ssl.key.password"))?;
        let (_, der) = pkcs8::der::pem::decode_vec(section)
            .map_err(|e| format!("{at}: bad {ENCRYPTED_KEY_LABEL} PEM section: {e}"))?;
        let info = pkcs8::EncryptedPrivateKeyInfo::try_from(der.as_slice())
            .map_err(|e| format!("{at}: bad encrypted private key: {e}"))?;
        check_key_derivation_cost(&info.encryption_algorithm, limits).map_err(|e| format!("{at}: {e}"))?;
        let key = info.decrypt(password).map_err(|e| {
            format!("{at}: cannot decrypt the private key ({e}): a wrong ssl.key.password, or not PBES2 with AES-CBC")
        })?;
        return Ok(PrivateKeyDer::Pkcs8(key.as_bytes().to_vec().into()));
    }
    if find(pem, b"Proc-Type: 4,ENCRYPTED").is_some() {
        return Err(format!(
            "{at}: the private key uses OpenSSL's legacy PEM encryption; convert it to encrypted PKCS#8 \
             (openssl pkcs8 -topk8 -v2 aes-256-cbc)"
        ));
    }
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("{at}: no private key (PKCS#8, PKCS#1 or SEC1): {e}"))
}

/// The key derivation of an encrypted key is the file's choice: refuse one that would
/// take longer or more memory than `limits` allow, before running it.
fn check_key_derivation_cost(scheme: &pkcs8::pkcs5::EncryptionScheme<'_>, limits: KdfLimits) -> Result<(), String> {
    use pkcs8::pkcs5::pbes2::Kdf;
    let Some(params) = scheme.pbes2() else {
        return Err("the private key is encrypted with PBES1, which is not supported (use PBES2)".into());
    };
    match &params.kdf {
        Kdf::Pbkdf2(p) if p.iteration_count > limits.pbkdf2_iterations_max => Err(format!(
            "the key's PBKDF2 asks for {} iterations, more than {}",
            p.iteration_count, limits.pbkdf2_iterations_max
        )),
        Kdf::Scrypt(p) => {
            let bytes = 128u128 * p.cost_parameter as u128 * p.block_size as u128 * p.parallelization.max(1) as u128;
            if bytes > limits.scrypt_bytes_max as u128 {
                return Err(format!("the key's scrypt asks for {bytes} bytes, more than {}", limits.scrypt_bytes_max));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The text of the first `-----BEGIN {label}-----` ... `-----END {label}-----` section.
fn pem_section<'a>(pem: &'a [u8], label: &str) -> Option<&'a [u8]> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = find(pem, begin.as_bytes())?;
    let stop = start + find(&pem[start..], end.as_bytes())? + end.len();
    Some(&pem[start..stop])
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn build(settings: &TlsSettings) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let keystore = read_pem(&settings.keystore)?;
    let chain = certificates(&settings.keystore, &keystore)?;
    let key = private_key(&settings.keystore, &keystore, settings.key_password.as_deref())?;
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
    use crate::model::limits;

    #[test]
    fn rfc2253_escapes_what_it_must() {
        assert_eq!(escape_rfc2253("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape_rfc2253(" lead"), "\\ lead");
        assert_eq!(escape_rfc2253("plain"), "plain");
    }

    #[test]
    fn missing_and_malformed_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = TlsSettings {
            keystore: dir.path().join("nope.pem"),
            key_password: None,
            truststore: None,
            client_auth: ClientAuth::None,
        };
        assert!(TlsServer::load(missing).err().unwrap().contains("nope.pem"));
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n").unwrap();
        let settings =
            TlsSettings { keystore: junk, key_password: None, truststore: None, client_auth: ClientAuth::None };
        assert!(TlsServer::load(settings).err().unwrap().contains("junk.pem"));
    }

    /// An Ed25519 PKCS#8 private key (RFC 8410's layout, a fixed seed): the bytes the
    /// encrypted forms below must decrypt back to.
    fn plain_pkcs8() -> Vec<u8> {
        let mut der =
            vec![0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
        der.extend(1..=32u8);
        der
    }

    fn encrypted_pem(params: pkcs8::pkcs5::pbes2::Parameters<'_>, password: &str) -> String {
        use pkcs8::der::EncodePem;
        let plain = plain_pkcs8();
        let info = pkcs8::PrivateKeyInfo::try_from(plain.as_slice()).unwrap();
        let doc = info.encrypt_with_params(params, password).unwrap();
        let info = pkcs8::EncryptedPrivateKeyInfo::try_from(doc.as_bytes()).unwrap();
        let pem = info.to_pem(pkcs8::LineEnding::LF).unwrap();
        // As in a key store: certificates around the key.
        format!("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n{pem}")
    }

    /// ssl.key.password opens an encrypted PKCS#8 key (PBES2: PBKDF2 or scrypt, AES-CBC);
    /// a missing or wrong password, OpenSSL's legacy encryption and a key derivation that
    /// would cost more than the named limits are refused with what to do.
    #[test]
    fn encrypted_keys_open_with_the_password_only() {
        use pkcs8::pkcs5::pbes2::Parameters;
        let path = Path::new("keystore.pem");
        let (salt, iv) = ([7u8; 16], [9u8; 16]);
        let pbkdf2 = encrypted_pem(Parameters::pbkdf2_sha256_aes256cbc(2048, &salt, &iv).unwrap(), "s3cret");
        let key = private_key(path, pbkdf2.as_bytes(), Some("s3cret")).unwrap();
        assert_eq!(key.secret_der(), plain_pkcs8().as_slice());
        let wrong = private_key(path, pbkdf2.as_bytes(), Some("guess")).unwrap_err();
        assert!(wrong.contains("wrong ssl.key.password"), "{wrong}");
        let none = private_key(path, pbkdf2.as_bytes(), None).unwrap_err();
        assert!(none.contains("set ssl.key.password"), "{none}");

        let small = pkcs8::pkcs5::scrypt::Params::new(10, 8, 1, 32).unwrap();
        let scrypt = encrypted_pem(Parameters::scrypt_aes256cbc(small, &salt, &iv).unwrap(), "s3cret");
        let key = private_key(path, scrypt.as_bytes(), Some("s3cret")).unwrap();
        assert_eq!(key.secret_der(), plain_pkcs8().as_slice());

        // Costs are checked on the parameters, before any derivation runs.
        let many = Parameters::pbkdf2_sha256_aes256cbc(limits::tls_key_pbkdf2_iterations_max + 1, &salt, &iv).unwrap();
        let err = check_key_derivation_cost(&many.into(), KdfLimits::NAMED).unwrap_err();
        assert!(err.contains("iterations"), "{err}");
        let big = pkcs8::pkcs5::scrypt::Params::new(22, 8, 1, 32).unwrap(); // 128 x 2^22 x 8 = 4 GiB
        let err =
            check_key_derivation_cost(&Parameters::scrypt_aes256cbc(big, &salt, &iv).unwrap().into(), KdfLimits::NAMED)
                .unwrap_err();
        assert!(err.contains("scrypt"), "{err}");
        let ok = pkcs8::pkcs5::scrypt::Params::new(17, 8, 1, 32).unwrap(); // 128 MiB
        assert!(check_key_derivation_cost(
            &Parameters::scrypt_aes256cbc(ok, &salt, &iv).unwrap().into(),
            KdfLimits::NAMED
        )
        .is_ok());

        let legacy = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAAA\n-----END RSA PRIVATE KEY-----\n";
        let err = private_key(path, legacy.as_bytes(), Some("s3cret")).unwrap_err();
        assert!(err.contains("openssl pkcs8 -topk8"), "{err}");
        let unencrypted = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, plain_pkcs8())
        );
        assert_eq!(private_key(path, unencrypted.as_bytes(), None).unwrap().secret_der(), plain_pkcs8().as_slice());
    }
}
