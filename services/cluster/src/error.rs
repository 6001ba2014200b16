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
    /// A TLS file for etcd (`--etcd-ca`, `--etcd-cert`, `--etcd-key`) cannot be read.
    #[error("cannot read {path}: {source}")]
    TlsFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ClusterError {
    /// Classifies an etcd client error: not answered (retry) or refused.
    pub fn from_etcd(error: etcd_client::Error) -> Self {
        match error {
            // `Unknown` is how tonic reports a connection that broke under a request (an
            // HTTP/2 keep-alive that timed out on a stalled etcd), and `Cancelled` a request
            // that ran past the client's timeout ("Timeout expired"): etcd did not answer.
            etcd_client::Error::GRpcStatus(ref status)
                if !matches!(
                    status.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Unknown
                        | tonic::Code::Cancelled
                ) =>
            {
                ClusterError::Refused(error)
            }
            other => ClusterError::Unreachable(other),
        }
    }

    /// Whether etcd refused because the lease named in the request no longer exists (it
    /// expired, or was revoked).
    pub fn is_lease_not_found(&self) -> bool {
        matches!(
            self,
            ClusterError::Refused(etcd_client::Error::GRpcStatus(status))
                if status.code() == tonic::Code::NotFound
        )
    }
}
