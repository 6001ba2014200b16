//! What every node of a cluster must share to talk to the others: the cluster protocol, and
//! whether its gRPC links are mutual TLS and under which CA.
//!
//! Each member says what it uses in its record ([`ShardRecord::transport`],
//! [`GatewayRecord::transport`]): the live records are what the cluster expects, and there
//! is no separate key to go stale when a whole cluster is redeployed with TLS turned on. A
//! node about to join reads them and refuses to start if it does not match
//! (`admission.rs`, before it registers); the coordinator gives cells only to shards that match
//! its own transport, so two mismatched nodes starting at the same moment into an empty
//! cluster cannot both be given a region (the younger one also leaves on its own: the
//! admission once more after registering compares with the members registered before it). A record
//! from an older node has no transport and is taken as matching: what it uses is unknown.
//!
//! [`ShardRecord::transport`]: crate::ShardRecord::transport
//! [`GatewayRecord::transport`]: crate::GatewayRecord::transport

use serde::{Deserialize, Serialize};
use std::fmt;

/// The version of what nodes say to each other (`proto/cluster.proto`, the relay links and
/// the records in etcd): raised when a node of the new version cannot work with one of the
/// old, so that a node of the other version is refused instead of failing on the wire.
pub const CLUSTER_PROTOCOL: u32 = 1;

/// How a node's gRPC links are carried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transport {
    /// [`CLUSTER_PROTOCOL`] of the node's binary.
    pub protocol: u32,
    /// Mutual TLS on every gRPC link (`--tls-*`); false: in the clear (`--insecure-grpc`,
    /// `--dev`).
    pub tls: bool,
    /// With TLS, the SHA-256 fingerprints (lowercase hex, of the DER) of the CA
    /// certificates the node trusts (its `--tls-ca`); two nodes match if they share one, so
    /// a bundle of the old and the new CA works while a CA is rotated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ca_sha256: Vec<String>,
}

impl Transport {
    /// This binary's, with mutual TLS trusting the CAs `ca_sha256`, or in the clear (None).
    pub fn of(ca_sha256: Option<Vec<String>>) -> Transport {
        Transport {
            protocol: CLUSTER_PROTOCOL,
            tls: ca_sha256.is_some(),
            ca_sha256: ca_sha256.unwrap_or_default(),
        }
    }

    /// Why a node using `self` cannot work with a member using `member`, if it cannot.
    pub fn mismatch(&self, member: &Transport) -> Option<Mismatch> {
        if self.protocol != member.protocol {
            return Some(Mismatch::Protocol { cluster: member.protocol, mine: self.protocol });
        }
        match (member.tls, self.tls) {
            (true, false) => Some(Mismatch::ClusterUsesTls { ca: member.ca_sha256.clone() }),
            (false, true) => Some(Mismatch::ClusterInTheClear),
            (true, true) if !self.ca_sha256.iter().any(|ca| member.ca_sha256.contains(ca)) => {
                Some(Mismatch::OtherCa {
                    cluster: member.ca_sha256.clone(),
                    mine: self.ca_sha256.clone(),
                })
            }
            _ => None,
        }
    }

    /// Whether a member's record (`None`: from an older node, unknown) matches `self`.
    pub fn admits(&self, member: Option<&Transport>) -> bool {
        member.is_none_or(|member| self.mismatch(member).is_none())
    }
}

/// What differs between a joining node's transport and the cluster's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    Protocol {
        cluster: u32,
        mine: u32,
    },
    /// The cluster uses mutual TLS (under these CAs); the node runs in the clear.
    ClusterUsesTls {
        ca: Vec<String>,
    },
    /// The cluster runs in the clear; the node asks for mutual TLS.
    ClusterInTheClear,
    /// Both use mutual TLS, under CAs that share no certificate.
    OtherCa {
        cluster: Vec<String>,
        mine: Vec<String>,
    },
}

/// A node refused because its transport does not match the cluster's: nothing to retry;
/// the node must be started again with other flags. The message says which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incompatible {
    /// The joining node's kind, as its command is named: `shard` or `gateway`.
    pub role: &'static str,
    /// The member it was compared with (`shard-1`).
    pub member: String,
    pub mismatch: Mismatch,
}

impl fmt::Display for Incompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Incompatible { role, member, mismatch } = self;
        let short = |fingerprints: &[String]| {
            let list: Vec<&str> = fingerprints.iter().map(|f| &f[..f.len().min(16)]).collect();
            list.join(", ")
        };
        match mismatch {
            Mismatch::ClusterUsesTls { ca } => {
                write!(
                    f,
                    "this cluster uses mutual TLS ({member} trusts the CA with SHA-256 {}...); \
                     start the {role} with --tls-ca, --tls-cert and --tls-key (a certificate \
                     from the cluster's CA naming the {role}: {role}-<id>)",
                    short(ca)
                )?;
                if *role == "shard" {
                    write!(f, ", or, on a cluster of `meridian up`, with --join <its data dir>")?;
                }
                Ok(())
            }
            Mismatch::ClusterInTheClear => write!(
                f,
                "this cluster runs its gRPC links in the clear ({member} has no TLS); start \
                 the {role} without --tls-ca, --tls-cert and --tls-key"
            ),
            Mismatch::OtherCa { cluster, mine } => write!(
                f,
                "this cluster uses mutual TLS under another CA ({member} trusts SHA-256 \
                 {}..., this {role}'s --tls-ca holds {}...); give the {role} the cluster's CA \
                 as --tls-ca and a certificate it issued",
                short(cluster),
                short(mine)
            ),
            Mismatch::Protocol { cluster, mine } => write!(
                f,
                "this cluster speaks cluster protocol {cluster} ({member}), this {role} \
                 {mine}: run the {role} from the Meridian release the cluster runs"
            ),
        }
    }
}

impl std::error::Error for Incompatible {}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(cas: &[&str]) -> Transport {
        Transport::of(Some(cas.iter().map(|s| s.to_string()).collect()))
    }

    #[test]
    fn a_node_in_the_clear_does_not_match_a_cluster_with_tls_and_says_what_to_do() {
        let cluster = tls(&["ab12cd34ef56ab12cd34ef56"]);
        let mismatch = Transport::of(None).mismatch(&cluster).expect("a mismatch");
        let refused = Incompatible { role: "shard", member: "shard-1".into(), mismatch };
        let message = refused.to_string();
        assert!(message.starts_with("this cluster uses mutual TLS"), "{message}");
        assert!(message.contains("start the shard with --tls-ca, --tls-cert and --tls-key"));
        assert!(message.contains("ab12cd34ef56ab12..."), "{message}");
        assert!(!Transport::of(None).admits(Some(&cluster)));
    }

    #[test]
    fn records_of_older_nodes_still_parse() {
        let old = r#"{"id":1,"grpc":"127.0.0.1:1","admin":"127.0.0.1:2","state":"serving"}"#;
        let shard: crate::ShardRecord = serde_json::from_str(old).expect("an old shard record");
        assert_eq!(shard.transport, None);
        let old = r#"{"id":1,"game":"127.0.0.1:1","admin":"127.0.0.1:2"}"#;
        let gateway: crate::GatewayRecord = serde_json::from_str(old).expect("an old one");
        assert_eq!(gateway.transport, None);
        let shard = crate::ShardRecord { transport: Some(tls(&["ca"])), ..shard };
        let back: crate::ShardRecord = serde_json::from_str(&shard.to_json()).expect("parses");
        assert_eq!(back, shard);
    }

    #[test]
    fn tls_needs_a_shared_ca_and_the_same_protocol() {
        let (old, new) = ("old".to_string(), "new".to_string());
        let cluster = tls(&[&old]);
        assert_eq!(tls(&[&old]).mismatch(&cluster), None);
        // A bundle of the old and the new CA, during a rotation.
        assert_eq!(tls(&[&new, &old]).mismatch(&cluster), None);
        assert_eq!(
            tls(&[&new]).mismatch(&cluster),
            Some(Mismatch::OtherCa { cluster: vec![old.clone()], mine: vec![new] })
        );
        assert_eq!(Transport::of(None).mismatch(&Transport::of(None)), None);
        assert_eq!(cluster.mismatch(&Transport::of(None)), Some(Mismatch::ClusterInTheClear));
        let newer = Transport { protocol: CLUSTER_PROTOCOL + 1, ..cluster.clone() };
        assert_eq!(
            cluster.mismatch(&newer),
            Some(Mismatch::Protocol { cluster: CLUSTER_PROTOCOL + 1, mine: CLUSTER_PROTOCOL })
        );
        assert!(cluster.admits(None), "an older node's record says nothing");
    }
}
