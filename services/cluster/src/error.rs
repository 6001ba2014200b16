/// What went wrong talking to etcd, split by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd could not be reached or a request timed out: retry with backoff.
    ///
    /// The message carries the client error's gist ([`gist`]), not the error as the source:
    /// its display repeats the whole tonic chain, which a report printing sources would
    /// then say twice (and a log line would carry 400 characters of it).
    #[error("etcd unreachable: {}", gist(.0))]
    Unreachable(etcd_client::Error),
    /// etcd answered but refused (lease gone, compaction, ...): redo the operation from scratch.
    #[error("etcd refused the request: {}", gist(.0))]
    Refused(etcd_client::Error),
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
    /// This node's transport does not match the cluster's (see `transport.rs`): give up,
    /// and say why; started again with other flags it may join.
    #[error("{0}")]
    Incompatible(Box<crate::Incompatible>),
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

/// What an etcd client error says, for a person: a gRPC status's message and, under it, the
/// innermost cause ("tcp connect error: Connection refused (os error 111)"), where the
/// error's own display nests the whole tonic chain, some of it twice.
pub fn gist(error: &etcd_client::Error) -> String {
    let mut innermost: &dyn std::error::Error = error;
    while let Some(next) = innermost.source() {
        innermost = next;
    }
    let cause = innermost.to_string();
    match error {
        etcd_client::Error::GRpcStatus(status) if status.message().is_empty() => {
            format!("{:?}: {cause}", status.code())
        }
        etcd_client::Error::GRpcStatus(status) if std::ptr::addr_eq(innermost, error) => {
            status.message().to_string()
        }
        etcd_client::Error::GRpcStatus(status) if cause.contains(status.message()) => cause,
        etcd_client::Error::GRpcStatus(status) => format!("{}: {cause}", status.message()),
        _ => cause,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32: `meridian status` with etcd down said tonic's whole error twice.
    #[test]
    fn an_unreachable_etcd_is_said_once_and_briefly() {
        let status = tonic::Status::unavailable("tcp connect error");
        let error = ClusterError::from_etcd(etcd_client::Error::GRpcStatus(status));
        assert!(matches!(error, ClusterError::Unreachable(_)));
        assert_eq!(error.to_string(), "etcd unreachable: tcp connect error");
        assert!(std::error::Error::source(&error).is_none(), "no source to print again");
        let refused = tonic::Status::permission_denied("etcdserver: permission denied");
        let error = ClusterError::from_etcd(etcd_client::Error::GRpcStatus(refused));
        assert_eq!(error.to_string(), "etcd refused the request: etcdserver: permission denied");
    }
}
