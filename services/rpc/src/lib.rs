//! The gateway<->shard protocol (`proto/cluster.proto`): generated messages and, with the
//! `grpc` feature (on by default), the tonic clients and servers.
//!
//! The gateway, its core, the shard, the simulator and the example game depend on it (and
//! `meridian-tls`, for the relay link's ALPN). This crate holds no logic beyond the generated code, the limits both ends agree on, the
//! one function that keeps a batch within them ([`split_entries`]), and the one reconnect
//! backoff of relay links and peer streams ([`backoff::Backoff`], sans-IO).

/// Types (and, with `grpc`, services) generated from `proto/cluster.proto` (package
/// `meridian.cluster.v1`).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/meridian.cluster.v1.rs"));
}

pub mod backoff;
pub mod link;

/// Encoded size of any batch (`GatewayBatch`, `ShardBatch`, `PeerBatch`) at most. Far
/// under [`MAX_GRPC_MESSAGE_BYTES`]: however much a round produces, it goes as several
/// batches, never as one message the other end refuses (which would end the stream, and
/// for a peer batch, which is resent first after a reconnect, end every stream after it).
pub const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// Inputs per `GatewayBatch` at most; a gateway sends several batches when it has more.
pub const MAX_INPUTS_PER_BATCH: usize = 4096;
/// Deliveries per `ShardBatch` at most.
pub const MAX_DELIVERIES_PER_BATCH: usize = 4096;
/// Messages per `PeerBatch` at most.
pub const MAX_PEER_MESSAGES_PER_BATCH: usize = 4096;
/// gRPC message size limit both ends configure. Batches stay within [`MAX_BATCH_BYTES`];
/// this is the margin for a single entry that is bigger on its own (a handoff carrying a
/// very crowded view), which goes alone in its batch.
pub const MAX_GRPC_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Room kept in a batch for its fields other than the repeated one (gateway id; sender,
/// epoch, sequence number and incarnation): at most 40 bytes encoded.
const BATCH_HEADER_BYTES: usize = 64;

/// How a batch's repeated entries are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimit {
    /// Field number of the batch's repeated field.
    pub tag: u32,
    pub max_entries: usize,
    /// What the entries may add up to, encoded as that field.
    pub max_entry_bytes: usize,
}

impl BatchLimit {
    const fn new(tag: u32, max_entries: usize) -> BatchLimit {
        BatchLimit { tag, max_entries, max_entry_bytes: MAX_BATCH_BYTES - BATCH_HEADER_BYTES }
    }
}

/// `GatewayBatch.inputs`.
pub const GATEWAY_BATCH: BatchLimit = BatchLimit::new(2, MAX_INPUTS_PER_BATCH);
/// `ShardBatch.deliveries`.
pub const SHARD_BATCH: BatchLimit = BatchLimit::new(1, MAX_DELIVERIES_PER_BATCH);
/// `PeerBatch.messages`.
pub const PEER_BATCH: BatchLimit = BatchLimit::new(3, MAX_PEER_MESSAGES_PER_BATCH);

/// Bytes `entry` adds to a batch as its repeated field `tag`: key, length, body.
pub fn entry_len<T: prost::Message>(tag: u32, entry: &T) -> usize {
    let body = entry.encoded_len();
    let key = (tag as usize) << 3 | 2;
    prost::length_delimiter_len(key) + prost::length_delimiter_len(body) + body
}

/// Cuts a batch's entries into runs within `limit`, keeping their order: sent one after
/// the other on one stream, they arrive as if sent as one. No run is empty; nothing in,
/// nothing out. An entry over the byte budget on its own goes alone in its run: whether it
/// can be sent at all (against [`MAX_GRPC_MESSAGE_BYTES`]) is for the caller to decide.
///
/// Entries that fit in one batch, the usual case, come back as they are, without a copy.
pub fn split_entries<T: prost::Message>(entries: Vec<T>, limit: BatchLimit) -> Vec<Vec<T>> {
    if entries.is_empty() {
        return Vec::new();
    }
    if entries.len() <= limit.max_entries {
        let mut bytes = 0;
        let fits = entries.iter().all(|entry| {
            bytes += entry_len(limit.tag, entry);
            bytes <= limit.max_entry_bytes
        });
        if fits {
            return vec![entries];
        }
    }
    let mut runs = Vec::new();
    let mut run = Vec::new();
    let mut run_bytes = 0;
    for entry in entries {
        let len = entry_len(limit.tag, &entry);
        if !run.is_empty()
            && (run.len() == limit.max_entries || run_bytes + len > limit.max_entry_bytes)
        {
            runs.push(std::mem::take(&mut run));
            run_bytes = 0;
        }
        run_bytes += len;
        run.push(entry);
    }
    runs.push(run);
    runs
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::pb::{peer_message::Kind, GatewayBatch, PeerBatch, PeerMessage, PlayerInput};
    use super::*;

    fn input(seq: u64, text_len: usize) -> PlayerInput {
        let chat = meridian_protocol::pb::Chat { text: "t".repeat(text_len) };
        let kind = Some(super::pb::player_input::Kind::Chat(chat));
        PlayerInput { session: u64::MAX, player_id: u64::MAX, seq, kind }
    }

    fn seqs(runs: &[Vec<PlayerInput>]) -> Vec<Vec<u64>> {
        runs.iter().map(|run| run.iter().map(|i| i.seq).collect()).collect()
    }

    #[test]
    fn entry_len_is_what_the_entry_adds_to_the_batch() {
        for text_len in [0, 1, 100, 200, 5000, 70_000] {
            let one = input(7, text_len);
            let batch =
                GatewayBatch { gateway_id: 0, lane: 0, inputs: vec![one.clone(), one.clone()] };
            assert_eq!(batch.encoded_len(), 2 * entry_len(GATEWAY_BATCH.tag, &one));
        }
        let message = PeerMessage {
            player_id: 1,
            generation: 2,
            subject_seq: 3,
            kind: Some(Kind::Chat(meridian_protocol::pb::Chat { text: "hi".into() })),
        };
        let batch = PeerBatch { messages: vec![message.clone()], ..Default::default() };
        assert_eq!(batch.encoded_len(), entry_len(PEER_BATCH.tag, &message));
    }

    #[test]
    fn a_batch_header_fits_in_the_room_kept_for_it() {
        let header = PeerBatch {
            from_shard: u32::MAX,
            epoch: u64::MAX,
            messages: Vec::new(),
            seq: u64::MAX,
            incarnation: u64::MAX,
        };
        assert!(header.encoded_len() <= BATCH_HEADER_BYTES);
        let hello = GatewayBatch { gateway_id: u32::MAX, lane: u32::MAX, inputs: Vec::new() };
        assert!(hello.encoded_len() <= BATCH_HEADER_BYTES);
    }

    #[test]
    fn what_fits_comes_back_whole_and_nothing_gives_nothing() {
        let entries: Vec<PlayerInput> = (1..=3).map(|seq| input(seq, 10)).collect();
        let pointer = entries.as_ptr();
        let runs = split_entries(entries, GATEWAY_BATCH);
        assert_eq!(seqs(&runs), vec![vec![1, 2, 3]]);
        assert_eq!(runs[0].as_ptr(), pointer, "not copied");
        assert!(split_entries(Vec::<PlayerInput>::new(), GATEWAY_BATCH).is_empty());
    }

    #[test]
    fn runs_are_cut_by_count_and_by_bytes_in_order() {
        let by_count = BatchLimit { tag: 2, max_entries: 2, max_entry_bytes: usize::MAX };
        let entries: Vec<PlayerInput> = (1..=5).map(|seq| input(seq, 10)).collect();
        assert_eq!(seqs(&split_entries(entries, by_count)), vec![vec![1, 2], vec![3, 4], vec![5]]);

        let one = entry_len(2, &input(1, 100));
        let by_bytes = BatchLimit { tag: 2, max_entries: usize::MAX, max_entry_bytes: 3 * one };
        let entries: Vec<PlayerInput> = (1..=7).map(|seq| input(seq, 100)).collect();
        let runs = split_entries(entries, by_bytes);
        assert_eq!(seqs(&runs), vec![vec![1, 2, 3], vec![4, 5, 6], vec![7]]);
    }

    #[test]
    fn an_entry_over_the_budget_goes_alone() {
        let one = entry_len(2, &input(1, 100));
        let limit = BatchLimit { tag: 2, max_entries: 100, max_entry_bytes: 2 * one };
        let entries = vec![input(1, 100), input(2, 10_000), input(3, 100), input(4, 100)];
        assert_eq!(seqs(&split_entries(entries, limit)), vec![vec![1], vec![2], vec![3, 4]]);
    }

    #[test]
    fn every_run_of_a_real_limit_encodes_within_the_batch_budget() {
        let entries: Vec<PlayerInput> = (1..=20_000).map(|seq| input(seq, 256)).collect();
        let runs = split_entries(entries, GATEWAY_BATCH);
        let mut next = 1;
        for run in runs {
            assert!(run.len() <= MAX_INPUTS_PER_BATCH);
            let batch = GatewayBatch { gateway_id: u32::MAX, lane: u32::MAX, inputs: run };
            assert!(batch.encoded_len() <= MAX_BATCH_BYTES);
            for input in &batch.inputs {
                assert_eq!(input.seq, next);
                next += 1;
            }
        }
        assert_eq!(next, 20_001);
    }
}
