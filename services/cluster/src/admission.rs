//! A joining node's admission: its [`Transport`] against the cluster members' (see
//! `transport.rs` for why the members' records are what the cluster expects).

use crate::keys::ClusterKeys;
use crate::model::{GatewayRecord, ShardRecord};
use crate::transport::{Incompatible, Transport};
use crate::ClusterError;

/// Reads the cluster's members and refuses `mine` if a member's transport does not match:
/// before registering (`registered: false`), any member; after (`true`), only members
/// registered before this node's key `me` was (the older one of two that started at once
/// stays).
pub async fn admit(
    mut client: etcd_client::Client,
    keys: &ClusterKeys,
    me: &str,
    role: &'static str,
    mine: &Transport,
    registered: bool,
) -> Result<(), ClusterError> {
    let options = || Some(etcd_client::GetOptions::new().with_prefix());
    let mut members = Vec::new();
    for prefix in [keys.shards_prefix(), keys.gateways_prefix()] {
        let answer =
            client.get(prefix.as_str(), options()).await.map_err(ClusterError::from_etcd)?;
        members.extend(answer.kvs().iter().map(|kv| {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            (key, kv.create_revision(), kv.value().to_vec())
        }));
    }
    let my_revision = members.iter().find(|(key, ..)| key == me).map(|(_, revision, _)| *revision);
    if registered && my_revision.is_none() {
        // Our key is gone (the lease lapsed meanwhile): the registration renews it, and the
        // coordinator's own check still keeps a mismatched shard without cells.
        return Ok(());
    }
    for (key, revision, value) in members {
        if key == me || my_revision.is_some_and(|mine| revision > mine) {
            continue;
        }
        let Some((member, transport)) = member_transport(keys, &key, &value) else { continue };
        if let Some(mismatch) = mine.mismatch(&transport) {
            return Err(ClusterError::Incompatible(Box::new(Incompatible {
                role,
                member,
                mismatch,
            })));
        }
    }
    Ok(())
}

/// The member a record under `key` describes (`shard-1`) and its transport, if it says.
fn member_transport(keys: &ClusterKeys, key: &str, value: &[u8]) -> Option<(String, Transport)> {
    if key.starts_with(&keys.shards_prefix()) {
        let record: ShardRecord = serde_json::from_slice(value).ok()?;
        Some((record.id.to_string(), record.transport?))
    } else {
        let record: GatewayRecord = serde_json::from_slice(value).ok()?;
        Some((record.id.to_string(), record.transport?))
    }
}
