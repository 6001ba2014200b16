//! Inputs on their way to the shards: this turn's, one batch per shard link, and batches
//! a link had no room for, sent before anything newer for the same shard so every
//! player's inputs stay in sequence. Filled by `messages`, `failover` and `output` (through
//! [`Ctx::relay`]) and by `delivery` (inputs resent to a new owner), emptied into the links
//! by [`Core::flush_inputs`] at the end of a turn.

use std::collections::VecDeque;
use std::sync::Arc;

use meridian_rpc::pb::{player_input::Kind as Input, PlayerInput};

use super::conn::UNCONFIRMED_LIMIT;
use super::{Conn, Core, Ctx};
use crate::routing::ShardLink;

/// Inputs a worker keeps waiting per shard for room in its link; past this, new inputs for
/// that shard's players are refused `UNAVAILABLE` (nothing numbered is lost).
pub(super) const STALLED_LIMIT: usize = 16_384;

#[derive(Default)]
pub(super) struct Outgoing {
    /// This turn's inputs, one batch per shard link.
    pub(super) batches: Vec<(Arc<ShardLink>, Vec<PlayerInput>)>,
    /// Batches the link could not take yet (full, or not open), oldest first, with their
    /// number of inputs. Past [`STALLED_LIMIT`] inputs the shard's players get UNAVAILABLE
    /// for new inputs instead.
    pub(super) stalled: Vec<(Arc<ShardLink>, VecDeque<Vec<PlayerInput>>, usize)>,
}

impl Outgoing {
    /// Drops everything queued for a failed link; how many inputs that was.
    pub(super) fn drop_for(&mut self, link: &Arc<ShardLink>) -> usize {
        let queued: usize = self
            .batches
            .iter()
            .filter(|(queued, _)| Arc::ptr_eq(queued, link))
            .map(|(_, inputs)| inputs.len())
            .chain(
                self.stalled
                    .iter()
                    .filter(|(queued, ..)| Arc::ptr_eq(queued, link))
                    .map(|(_, _, n)| *n),
            )
            .sum();
        self.batches.retain(|(queued, _)| !Arc::ptr_eq(queued, link));
        self.stalled.retain(|(queued, ..)| !Arc::ptr_eq(queued, link));
        queued
    }
}

impl Core {
    /// Hands this iteration's inputs to the links: one batch per shard (more if over the
    /// batch limits), after whatever waited for that link to have room or to open.
    pub(super) fn flush_inputs(&mut self) {
        let (ctx, endpoints) = (&mut self.ctx, &mut self.endpoints);
        let metrics = Arc::clone(&ctx.shared.metrics);
        let mut send =
            |link: &Arc<ShardLink>, inputs: Vec<PlayerInput>| -> Result<(), Vec<PlayerInput>> {
                match endpoints.find_link(link).and_then(|index| endpoints.link_mut(index)) {
                    Some(uplink) if uplink.has_room() => {
                        metrics.inputs_relayed.add(inputs.len() as u64);
                        metrics.batches_to_shards.add(uplink.queue(inputs) as u64);
                        Ok(())
                    }
                    // Full, or not open yet (a shard that just joined): wait in turn.
                    Some(_) => Err(inputs),
                    None if link.accepts_inputs() => Err(inputs),
                    // Failed: its moves in flight were answered when it failed; nothing new is
                    // queued for it (see `accepts_inputs`).
                    None => Ok(()),
                }
            };
        for (link, batches, queued) in ctx.outgoing.stalled.iter_mut() {
            while let Some(batch) = batches.pop_front() {
                let n = batch.len();
                match send(link, batch) {
                    Ok(()) => *queued -= n,
                    Err(batch) => {
                        batches.push_front(batch);
                        break;
                    }
                }
            }
        }
        ctx.outgoing.stalled.retain(|(_, batches, _)| !batches.is_empty());
        for (link, inputs) in ctx.outgoing.batches.drain(..) {
            if inputs.is_empty() {
                continue;
            }
            if let Some((_, batches, queued)) =
                ctx.outgoing.stalled.iter_mut().find(|(waiting, ..)| Arc::ptr_eq(waiting, &link))
            {
                *queued += inputs.len();
                batches.push_back(inputs);
                continue;
            }
            if let Err(inputs) = send(&link, inputs) {
                if link.is_up() {
                    metrics.relay_queue_full.add(inputs.len() as u64);
                    tracing::debug!(shard = %link.id, "relay link full; inputs wait");
                }
                let n = inputs.len();
                ctx.outgoing.stalled.push((link, VecDeque::from([inputs]), n));
            }
        }
    }
}

impl Ctx {
    /// Inputs for `link` waiting for room in the relay's queue.
    pub(super) fn stalled_for(&self, link: &Arc<ShardLink>) -> usize {
        if self.outgoing.stalled.is_empty() {
            return 0;
        }
        self.outgoing.stalled.iter().find(|(l, ..)| Arc::ptr_eq(l, link)).map_or(0, |(_, _, n)| *n)
    }

    pub(super) fn relay(
        &mut self,
        link: &Arc<ShardLink>,
        session: u64,
        player: u64,
        seq: u64,
        input: Input,
    ) {
        let input = PlayerInput { session, player_id: player, seq, kind: Some(input) };
        self.enqueue(link, input);
    }

    /// Relays an in-game input (move, chat, ping) and keeps a copy until it is confirmed.
    pub(super) fn relay_in_game(
        &mut self,
        conn: &mut Conn,
        link: &Arc<ShardLink>,
        session: u64,
        player: u64,
        input: Input,
    ) {
        let seq = conn.take_seq();
        let input = PlayerInput { session, player_id: player, seq, kind: Some(input) };
        if conn.unconfirmed.len() >= UNCONFIRMED_LIMIT {
            conn.unconfirmed.pop_front();
        }
        conn.unconfirmed.push_back(input.clone());
        self.enqueue(link, input);
    }

    pub(super) fn enqueue(&mut self, link: &Arc<ShardLink>, input: PlayerInput) {
        match self.outgoing.batches.iter_mut().find(|(l, _)| Arc::ptr_eq(l, link)) {
            Some((_, batch)) => batch.push(input),
            None => self.outgoing.batches.push((Arc::clone(link), vec![input])),
        }
    }
}
