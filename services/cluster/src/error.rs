/// What went wrong talking to etcd, split by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd could not be reached or a request timed out: retry with backoff.
    #[error("etcd unreachable: {0}")]
    Unreachable(#[source] etcd_client::Error),
    /// etcd answered but refused (lease gone, compaction, ...): redo the operation from scratch.
    #[error("etcd refused the request: {0}")]
    Refused(#[source] etcd_client::Error),
    /// A value under our prefix does not parse: a bug or a foreign writer; skip the key.
    #[error("bad value under {key}: {source}")]
    BadValue {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    /// etcd says our lease is gone: the cluster has taken us for dead meanwhile.
    #[error("lease expired")]
    LeaseExpired,
    /// Another writer changed the key between our read and our write: read again.
    #[error("lost a race writing {0}")]
    Conflict(String),
}

impl ClusterError {
    pub(crate) fn from_etcd(error: etcd_client::Error) -> Self {
        match error {
            etcd_client::Error::GRpcStatus(ref status)
                if status.code() != tonic::Code::Unavailable
                    && status.code() != tonic::Code::DeadlineExceeded =>
            {
                ClusterError::Refused(error)
            }
            other => ClusterError::Unreachable(other),
        }
    }
}
