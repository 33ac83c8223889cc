//! The broker's listeners as the connections see them: name, security protocol, the TLS
//! config (shared by every TLS listener, reloadable) and the SASL settings.
//!
//! Built once in `server::run` from the resolved `ListenerSpec`s and shared, read-only,
//! by every shard; the only thing that changes is the TLS config, which `TlsServer`
//! swaps without a lock (the TLS watcher thread, `spawn_tls_watcher`, does the reload
//! off the data cores).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{BrokerConfig, ListenerSpec};
use crate::security::principal_mapping::PrincipalMapper;
use crate::security::sasl::Mechanism;
use crate::security::tls::TlsServer;

/// What a SASL listener needs to authenticate clients.
pub struct SaslSettings {
    pub mechanisms: Vec<Mechanism>,
    pub plain_users: BTreeMap<String, String>,
    pub failed_authentication_delay_ms: u64,
    /// connections.max.reauth.ms; 0: sessions do not expire.
    pub reauth_ms: u64,
}

/// One listener, as a connection accepted on it sees it.
pub struct ListenerRuntime {
    pub spec: ListenerSpec,
    pub name: Arc<str>,
    pub tls: Option<Arc<TlsServer>>,
    pub sasl: Option<Arc<SaslSettings>>,
    /// ssl.principal.mapping.rules, for the client certificates of SSL listeners.
    pub principal_mapper: Arc<PrincipalMapper>,
}

/// Every listener of the broker, with the TLS config loaded (an error names the file).
pub fn build(config: &BrokerConfig) -> anyhow::Result<Vec<Arc<ListenerRuntime>>> {
    let specs = config.listener_specs().map_err(|e| anyhow::anyhow!(e))?;
    let tls = match specs.iter().any(|l| l.protocol.uses_tls()) {
        false => None,
        true => {
            let settings =
                config.tls_settings().ok_or_else(|| anyhow::anyhow!("TLS listeners need ssl.keystore.location"))?;
            Some(Arc::new(TlsServer::load(settings).map_err(|e| anyhow::anyhow!("TLS: {e}"))?))
        }
    };
    let sasl = Arc::new(SaslSettings {
        mechanisms: config.sasl_mechanisms().map_err(|e| anyhow::anyhow!(e))?,
        plain_users: config.sasl_plain_users.clone(),
        failed_authentication_delay_ms: config.connection_failed_authentication_delay_ms,
        reauth_ms: config.connections_max_reauth_ms,
    });
    let principal_mapper =
        Arc::new(PrincipalMapper::parse(&config.ssl_principal_mapping_rules).map_err(|e| anyhow::anyhow!(e))?);
    Ok(specs
        .into_iter()
        .map(|spec| {
            Arc::new(ListenerRuntime {
                principal_mapper: principal_mapper.clone(),
                name: Arc::from(spec.name.as_str()),
                tls: if spec.protocol.uses_tls() { tls.clone() } else { None },
                sasl: if spec.protocol.uses_sasl() { Some(sasl.clone()) } else { None },
                spec,
            })
        })
        .collect())
}

/// Reload the TLS config when its files change, until shutdown (a thread of its own:
/// file reads and key parsing never run on a data core).
pub fn spawn_tls_watcher(listeners: &[Arc<ListenerRuntime>], shutdown: Arc<AtomicBool>) -> anyhow::Result<()> {
    let Some(tls) = listeners.iter().find_map(|l| l.tls.clone()) else {
        return Ok(());
    };
    std::thread::Builder::new().name("spate-tls-watch".into()).spawn(move || {
        let interval = Duration::from_millis(crate::model::limits::tls_reload_check_interval_ms);
        let step = Duration::from_millis(100);
        let mut waited = Duration::ZERO;
        while !shutdown.load(Ordering::Relaxed) {
            std::thread::sleep(step);
            waited += step;
            if waited < interval {
                continue;
            }
            waited = Duration::ZERO;
            match tls.reload_if_changed() {
                Ok(true) => tracing::info!(keystore = %tls.settings().keystore.display(), "TLS certificates reloaded"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "TLS files changed but do not load: the previous ones stay in use")
                }
            }
        }
    })?;
    Ok(())
}
