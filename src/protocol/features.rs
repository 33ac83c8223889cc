//! Feature flags (KIP-584): what ApiVersions v3+ reports as supported and finalized
//! features, and what UpdateFeatures (`kafka-features.sh upgrade/downgrade/disable`) may
//! change. Clients pick behaviour from the finalized levels: the Java producer uses
//! transactions v2 (KIP-890 part 2) only where `transaction.version` is 2 or more, so
//! every level here is one Spate honours.
//!
//! Spate's features are fixed by its version: each broker finalizes the levels of this
//! table and supports only those (a feature at level 0 supports 0). UpdateFeatures to the
//! finalized level succeeds without changing anything; any other level is refused with
//! INVALID_UPDATE_VERSION and the range this broker supports, as Kafka's controller
//! refuses a level some broker does not support.
//!
//! The names and levels are Kafka 4.4's (`org.apache.kafka.server.common.Feature`):
//! - `metadata.version` 22 is 4.0-IV0, the first Kafka 4 level, where `group.version` 1
//!   (the consumer group protocol) became the default. The levels after it add eligible
//!   leader replicas (KIP-966, 4.0-IV1), which Spate does not have, and transactions v2
//!   (4.0-IV2): Kafka's controller finalizes `transaction.version` 2 only from 4.0-IV2,
//!   Spate reports it beside 4.0-IV0 because it has the one and not the other (clients
//!   read each feature on its own). Spate keeps its metadata in Kafka's ZooKeeper layout, not in a KRaft log:
//!   the level says which Kafka behaviour clients get, not a log format.
//! - `group.version` 1: KIP-848 consumer groups (`src/group/consumer.rs`).
//! - `transaction.version` 2: KIP-890 part 2, the epoch bump at every transaction's end
//!   (EndTxn v5, `TxnCoordinator::end_txn_v2`), partitions added by their leaders
//!   (Produce v12, TxnOffsetCommit v5); `__transaction_state` values in version 1 (level
//!   1's flexible values, `txn::log_records`). Clients of transaction version 1 keep
//!   working: the version of each request decides, as in Kafka.
//! - `eligible.leader.replicas.version`, `share.version` and `streams.version` 0: no
//!   eligible leader replicas (KIP-966), share groups (KIP-932) or streams groups
//!   (KIP-1071) yet.
//!
//! Left out: `kraft.version` (Spate runs no KRaft quorum; its coordinator is embedded or
//! Apache ZooKeeper) and Kafka's test features.

/// One feature: its name and the one level this broker finalizes (the module's list says
/// why each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    pub name: &'static str,
    pub level: i16,
}

/// Kafka's `metadata.version` feature name.
pub const METADATA_VERSION: &str = "metadata.version";

/// Every feature this broker reports, with its finalized level.
pub const FEATURES: &[Feature] = &[
    Feature { name: METADATA_VERSION, level: 22 },
    Feature { name: "group.version", level: 1 },
    Feature { name: "transaction.version", level: 2 },
    Feature { name: "eligible.leader.replicas.version", level: 0 },
    Feature { name: "share.version", level: 0 },
    Feature { name: "streams.version", level: 0 },
];

/// ApiVersions' FinalizedFeaturesEpoch: the finalized levels never change while a broker
/// runs, so one epoch; raise it with any change to `FEATURES`, so that a client talking to
/// brokers of two Spate versions during a rolling upgrade takes the newer levels (the Java
/// client keeps the features of the highest epoch it has seen).
pub const FINALIZED_FEATURES_EPOCH: i64 = 2;

/// The first ApiVersions version whose SupportedFeatures may carry a minimum of 0: older
/// Java clients fail to read one (KAFKA-17492), so Kafka leaves those features out below
/// it.
pub const SUPPORTED_MIN_ZERO_VERSION: i16 = 4;

/// UpdateFeatures' upgrade types (`FeatureUpdate.UpgradeType`).
pub const UPGRADE: i8 = 1;
pub const SAFE_DOWNGRADE: i8 = 2;
pub const UNSAFE_DOWNGRADE: i8 = 3;

/// `(name, min, max)` of each supported feature for an ApiVersions answer in
/// `api_version`.
pub fn supported(api_version: i16) -> impl Iterator<Item = (&'static str, i16, i16)> {
    FEATURES
        .iter()
        .filter(move |f| f.level > 0 || api_version >= SUPPORTED_MIN_ZERO_VERSION)
        .map(|f| (f.name, f.level, f.level))
}

/// `(name, level)` of each finalized feature; level 0 means off, and Kafka lists only the
/// others.
pub fn finalized() -> impl Iterator<Item = (&'static str, i16)> {
    FEATURES.iter().filter(|f| f.level > 0).map(|f| (f.name, f.level))
}

/// One UpdateFeatures entry: `Ok` if `name` may be set to `level` with `upgrade_type`
/// (only the level it has), else Kafka's INVALID_UPDATE_VERSION message. UpdateFeatures
/// v0 has no upgrade type: its `allow_downgrade` maps to SAFE_DOWNGRADE, else UPGRADE.
pub fn check_update(name: &str, level: i16, upgrade_type: i8) -> Result<(), String> {
    let invalid = |why: String| Err(format!("Invalid update version {level} for feature {name}. {why}"));
    if !(UPGRADE..=UNSAFE_DOWNGRADE).contains(&upgrade_type) {
        return invalid("The controller does not support the given upgrade type.".into());
    }
    if level < 0 {
        return invalid("A feature version cannot be less than 0.".into());
    }
    let Some(f) = FEATURES.iter().find(|f| f.name == name) else {
        return invalid(format!("This Spate broker does not support feature {name}."));
    };
    if level != f.level {
        return invalid(format!(
            "This Spate broker only supports version {} of it: its features are fixed by its release.",
            f.level
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalized_lists_only_levels_above_zero() {
        let f: Vec<_> = finalized().collect();
        assert_eq!(f, vec![(METADATA_VERSION, 22), ("group.version", 1), ("transaction.version", 2)]);
    }

    #[test]
    fn features_with_minimum_zero_only_from_version_4() {
        let v3: Vec<_> = supported(3).map(|(n, ..)| n).collect();
        assert_eq!(v3, vec![METADATA_VERSION, "group.version", "transaction.version"]);
        let v4: Vec<_> = supported(4).collect();
        assert_eq!(v4.len(), FEATURES.len());
        assert!(v4.contains(&("share.version", 0, 0)));
    }

    #[test]
    fn an_update_to_the_finalized_level_is_accepted_and_any_other_refused() {
        assert_eq!(check_update("group.version", 1, UPGRADE), Ok(()));
        assert_eq!(check_update(METADATA_VERSION, 22, SAFE_DOWNGRADE), Ok(()));
        let e = check_update("share.version", 1, UPGRADE).unwrap_err();
        assert!(e.starts_with("Invalid update version 1 for feature share.version."), "{e}");
        assert!(e.contains("only supports version 0"), "{e}");
        assert_eq!(check_update("transaction.version", 2, UPGRADE), Ok(()));
        assert!(check_update("group.version", 0, SAFE_DOWNGRADE).is_err(), "the consumer protocol stays on");
        assert!(check_update("kraft.version", 1, UPGRADE).unwrap_err().contains("does not support feature"));
        assert!(check_update("group.version", -1, UPGRADE).unwrap_err().contains("less than 0"));
        assert!(check_update("group.version", 1, 0).unwrap_err().contains("upgrade type"));
    }
}
