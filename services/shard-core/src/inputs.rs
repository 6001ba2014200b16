//! The core's inputs part: inputs for players that are not seated here.
//!
//! A local player's own inputs are sequenced by its seat (`sequence.rs`). This part keeps
//! what arrives for a player that is not here: inputs held until its handoff or restore
//! arrives, the seqs refused meanwhile (so a player that arrives late steps over them),
//! the sessions that left the world here (whose late inputs are dropped), and when an
//! input was last forwarded to a player's new owner (a drain waits for that to go quiet).
//!
//! Only `ShardCore` calls it; it decides what is held, dropped or refused, and hands the
//! core back the inputs to apply or to answer. It sends nothing itself.

use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

use meridian_rpc::pb::player_input::Kind as Input;
use meridian_rpc::pb::PlayerInput;
use meridian_world::PlayerId;
use tracing::warn;

use crate::sequence::Refused;
use crate::types::{EarlyInputs, GatewayLane, LinkId};

/// Inputs held for a player not (yet) here, waiting for its handoff to arrive; beyond
/// that, new ones are refused (a `Leave` is always held).
pub(crate) const EARLY_LIMIT: usize = 256;
/// How long inputs from a gateway wait for their player before they are refused. Forwarded
/// inputs, which cannot be answered here without their gateway's link, wait `FORWARD_FOR`:
/// the shard that forwarded them handed their player here.
pub(crate) const EARLY_WAIT: Duration = Duration::from_secs(2);
/// How long refused seqs and ended sessions are remembered, and forwarded inputs wait.
pub(crate) const FORWARD_FOR: Duration = Duration::from_secs(30);
/// A draining shard stops only once no input for a handed-off player has arrived (and no
/// handoff happened) for this long: the gateways have all switched.
pub(crate) const FORWARD_QUIET: Duration = Duration::from_secs(1);

/// An input and the gateway link it came through (`None`: forwarded by a peer).
pub(crate) type Arrived = (Option<LinkId>, PlayerInput);

#[derive(Default)]
pub(crate) struct Inputs {
    early: FxHashMap<PlayerId, EarlyInputs>,
    /// Inputs refused while their player was not here, by player and session, with when
    /// the last was: kept `FORWARD_FOR`, so a player that arrives late steps over them.
    refused: FxHashMap<(PlayerId, u64), (Instant, Refused)>,
    /// Sessions whose player left the world here (a Leave or a logout), with when, kept
    /// `FORWARD_FOR`: that session's inputs still arriving (forwarded copies coming back
    /// from a shard the player was handed to) were all applied before its Leave, and are
    /// dropped rather than held for a player that will not come back on that session.
    ended: FxHashMap<PlayerId, (u64, Instant)>,
    /// When an input for a handed-off player was last forwarded to its new owner.
    last_forward: Option<Instant>,
}

impl Inputs {
    /// Holds an input for a player not here. Past the hold limit it is not held: it comes
    /// back, with the link to answer it through if one is known, to be refused.
    pub fn hold(
        &mut self,
        player: PlayerId,
        link: Option<LinkId>,
        input: PlayerInput,
        now: Instant,
    ) -> Option<Arrived> {
        let leave = matches!(input.kind, Some(Input::Leave(_)));
        let entry = self.early.entry(player).or_insert_with(|| (now, Vec::new()));
        if entry.1.len() < EARLY_LIMIT || leave {
            entry.1.push((link, input));
            return None;
        }
        let link = link.or_else(|| self.early_link(player, input.session));
        Some((link, input))
    }

    /// The gateway link that inputs of `session` for a player not here came through, if
    /// any did: forwarded inputs of that connection are answered through it.
    fn early_link(&self, player: PlayerId, session: u64) -> Option<LinkId> {
        let (_, inputs) = self.early.get(&player)?;
        inputs.iter().find(|(link, input)| link.is_some() && input.session == session)?.0
    }

    /// Whether `input` is a copy of one given up on here (its player not here then): the
    /// gateway sends a dropped connection's `Leave` to every shard, and a shard the player
    /// was handed from forwards its copy later. Such a copy is neither held nor answered:
    /// the first was answered, and a `Leave` given up on is applied should the player come.
    pub fn given_up(&self, input: &PlayerInput) -> bool {
        let key = (PlayerId(input.player_id), input.session);
        self.refused.get(&key).is_some_and(|(_, refused)| refused.contains(input.seq))
    }

    /// Records the seq of an input given up on, so that its player, should it arrive
    /// after all, steps over it; the input comes back if it is to be answered (a `Leave`
    /// is kept instead, for such a player to leave the world).
    pub fn refuse(&mut self, input: PlayerInput, now: Instant) -> Option<PlayerInput> {
        let key = (PlayerId(input.player_id), input.session);
        let (since, refused) = self.refused.entry(key).or_insert_with(|| (now, Refused::default()));
        *since = now;
        refused.record(input)
    }

    /// A player arrived on `session`: the inputs held for it, in arrival order, and what was
    /// refused on that session while it was not here.
    pub fn arrived(&mut self, player: PlayerId, session: u64) -> (Vec<Arrived>, Option<Refused>) {
        let inputs = self.early.remove(&player).map(|(_, inputs)| inputs).unwrap_or_default();
        let refused = self.refused.remove(&(player, session)).map(|(_, refused)| refused);
        (inputs, refused)
    }

    /// Inputs this shard forwarded while the player was away that the shard handing it
    /// back had not applied (seq `from_seq` on): they join the inputs that waited here, one
    /// of each (the same input may have come back already), in seq order.
    pub fn hold_returned(
        &mut self,
        player: PlayerId,
        forwarded: Vec<PlayerInput>,
        from_seq: u64,
        now: Instant,
    ) {
        if !forwarded.iter().any(|input| input.seq >= from_seq) {
            return;
        }
        let (_, waiting) = self.early.entry(player).or_insert_with(|| (now, Vec::new()));
        for input in forwarded.into_iter().filter(|i| i.seq >= from_seq) {
            let known = |(_, w): &Arrived| w.session == input.session && w.seq == input.seq;
            if !waiting.iter().any(known) {
                waiting.push((None, input));
            }
        }
        waiting.sort_by_key(|(_, input)| input.seq);
    }

    /// The held inputs of every player with a restore passed on to this shard that waited
    /// for the link of `opened`, each player's in seq order.
    pub fn restores_for(&mut self, opened: GatewayLane) -> Vec<Vec<Arrived>> {
        let mut waiting: Vec<PlayerId> = self
            .early
            .iter()
            .filter(|(_, (_, inputs))| {
                inputs.iter().any(|(link, input)| {
                    link.is_none()
                        && matches!(&input.kind, Some(Input::Join(join))
                            if join.restore
                                && GatewayLane::of_session(join.gateway_id, input.session) == opened)
                })
            })
            .map(|(player, _)| *player)
            .collect();
        let mut out = Vec::with_capacity(waiting.len());
        for player in waiting.drain(..) {
            let Some((_, mut inputs)) = self.early.remove(&player) else { continue };
            inputs.sort_by_key(|(_, input)| input.seq);
            out.push(inputs);
        }
        out
    }

    /// Players whose held inputs waited longer than they may.
    pub fn overdue(&self, now: Instant) -> Vec<PlayerId> {
        self.early
            .iter()
            .filter(|(_, (since, _))| now - *since > EARLY_WAIT)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The overdue inputs of `player` to refuse, in seq order, each with the link of its
    /// connection if any input of that connection came through one. Forwarded ones no link
    /// is known for keep waiting until `FORWARD_FOR`: they cannot be answered, and applied
    /// late beats never.
    pub fn expire(&mut self, player: PlayerId, now: Instant) -> Vec<Arrived> {
        let Some((since, mut inputs)) = self.early.remove(&player) else {
            return Vec::new();
        };
        inputs.sort_by_key(|(_, input)| input.seq);
        let links: FxHashMap<u64, LinkId> =
            inputs.iter().filter_map(|(link, input)| Some((input.session, (*link)?))).collect();
        let give_up = now - since > FORWARD_FOR;
        let (mut waiting, mut refused) = (Vec::new(), Vec::new());
        for (link, input) in inputs {
            match link.or_else(|| links.get(&input.session).copied()) {
                None if !give_up => waiting.push((None, input)),
                link => refused.push((link, input)),
            }
        }
        if !refused.is_empty() {
            warn!(%player, refused = refused.len(), "inputs for a player that has not arrived refused");
        }
        if !waiting.is_empty() {
            self.early.insert(player, (since, waiting));
        }
        refused
    }

    /// `player` left the world here on `session` (a Leave or a logout).
    pub fn session_ended(&mut self, player: PlayerId, session: u64, now: Instant) {
        self.ended.insert(player, (session, now));
    }

    /// `player` is in the world here again (on a new session).
    pub fn back(&mut self, player: PlayerId) {
        self.ended.remove(&player);
    }

    /// Whether `session` of `player` left the world here lately.
    pub fn ended(&self, player: PlayerId, session: u64) -> bool {
        self.ended.get(&player).is_some_and(|(ended, _)| *ended == session)
    }

    /// An input was forwarded to a handed-off player's new owner.
    pub fn forwarded(&mut self, now: Instant) {
        self.last_forward = Some(now);
    }

    /// Whether no input has been forwarded for `FORWARD_QUIET`.
    pub fn forwarding_quiet(&self, now: Instant) -> bool {
        self.last_forward.is_none_or(|at| now.saturating_duration_since(at) >= FORWARD_QUIET)
    }

    /// Forgets refused seqs and ended sessions older than `FORWARD_FOR`.
    pub fn expire_memory(&mut self, now: Instant) {
        self.refused.retain(|_, (since, _)| now - *since < FORWARD_FOR);
        self.ended.retain(|_, (_, since)| now - *since < FORWARD_FOR);
    }

    /// Drops every held input and refused seq (the shard was taken for dead and starts
    /// over; the sessions that ended here stay ended).
    pub fn clear(&mut self) {
        self.early.clear();
        self.refused.clear();
    }

    /// Players with inputs held for them, in id order.
    pub fn players_waited_for(&self) -> Vec<PlayerId> {
        let mut players: Vec<PlayerId> = self.early.keys().copied().collect();
        players.sort_unstable();
        players
    }

    /// Inputs held, and (player, session)s with refused seqs remembered.
    pub fn sizes(&self) -> (usize, usize) {
        (self.early.values().map(|(_, inputs)| inputs.len()).sum(), self.refused.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_protocol::pb::Ping;
    use meridian_rpc::pb::Leave;

    const P: PlayerId = PlayerId(7);

    fn ping(seq: u64, session: u64) -> PlayerInput {
        PlayerInput {
            player_id: P.0,
            seq,
            session,
            kind: Some(Input::Ping(Ping { client_time: seq })),
        }
    }

    fn leave(seq: u64) -> PlayerInput {
        PlayerInput { player_id: P.0, seq, session: 1, kind: Some(Input::Leave(Leave::default())) }
    }

    #[test]
    fn past_the_limit_inputs_come_back_to_be_refused_through_their_connections_link() {
        let (mut inputs, now) = (Inputs::default(), Instant::now());
        assert!(inputs.hold(P, Some(LinkId(3)), ping(0, 1), now).is_none());
        for seq in 1..EARLY_LIMIT as u64 {
            assert!(inputs.hold(P, None, ping(seq, 1), now).is_none());
        }
        let (link, input) = inputs.hold(P, None, ping(999, 1), now).expect("over the limit");
        assert_eq!((link, input.seq), (Some(LinkId(3)), 999), "answered through session 1's link");
        assert!(inputs.hold(P, None, leave(1000), now).is_none(), "a Leave is always held");
        assert_eq!(inputs.sizes().0, EARLY_LIMIT + 1);
    }

    #[test]
    fn an_arriving_player_gets_its_held_inputs_and_its_sessions_refused_seqs() {
        let (mut inputs, now) = (Inputs::default(), Instant::now());
        inputs.hold(P, None, ping(4, 1), now);
        inputs.hold(P, Some(LinkId(1)), ping(2, 1), now);
        assert!(inputs.refuse(ping(3, 1), now).is_some(), "a ping is answered");
        assert!(inputs.refuse(ping(9, 2), now).is_some());
        let (held, refused) = inputs.arrived(P, 1);
        assert_eq!(held.iter().map(|(_, i)| i.seq).collect::<Vec<_>>(), [4, 2], "arrival order");
        assert!(refused.expect("session 1 refused seq 3").seqs.contains(3));
        assert_eq!(inputs.sizes(), (0, 1), "session 2's refusal is still remembered");
    }

    #[test]
    fn overdue_inputs_are_refused_unless_forwarded_with_no_link_known() {
        let (mut inputs, start) = (Inputs::default(), Instant::now());
        inputs.hold(P, Some(LinkId(5)), ping(2, 1), start);
        inputs.hold(P, None, ping(1, 1), start);
        inputs.hold(P, None, ping(1, 2), start);
        assert!(inputs.overdue(start + EARLY_WAIT).is_empty());
        let later = start + EARLY_WAIT + Duration::from_millis(1);
        assert_eq!(inputs.overdue(later), [P]);
        let refused = inputs.expire(P, later);
        let refused: Vec<_> = refused.iter().map(|(link, i)| (*link, i.session, i.seq)).collect();
        assert_eq!(refused, [(Some(LinkId(5)), 1, 1), (Some(LinkId(5)), 1, 2)]);
        assert_eq!(inputs.players_waited_for(), [P], "session 2's has no link: it waits");
        let refused = inputs.expire(P, start + FORWARD_FOR + Duration::from_millis(1));
        assert_eq!(refused.len(), 1, "until FORWARD_FOR");
        assert!(inputs.players_waited_for().is_empty());
    }

    #[test]
    fn returned_inputs_join_the_held_ones_once_each_in_seq_order() {
        let (mut inputs, now) = (Inputs::default(), Instant::now());
        inputs.hold(P, None, ping(6, 1), now);
        inputs.hold_returned(P, vec![ping(3, 1), ping(5, 1), ping(6, 1), ping(7, 1)], 5, now);
        let (held, _) = inputs.arrived(P, 1);
        assert_eq!(held.iter().map(|(_, i)| i.seq).collect::<Vec<_>>(), [5, 6, 7]);
    }

    #[test]
    fn ended_sessions_and_forwarding_are_forgotten_in_time() {
        let (mut inputs, now) = (Inputs::default(), Instant::now());
        inputs.session_ended(P, 4, now);
        assert!(inputs.ended(P, 4) && !inputs.ended(P, 5));
        assert!(inputs.forwarding_quiet(now));
        inputs.forwarded(now);
        assert!(!inputs.forwarding_quiet(now + FORWARD_QUIET / 2));
        assert!(inputs.forwarding_quiet(now + FORWARD_QUIET));
        inputs.expire_memory(now + FORWARD_FOR);
        assert!(!inputs.ended(P, 4));
        inputs.session_ended(P, 4, now);
        inputs.back(P);
        assert!(!inputs.ended(P, 4));
    }
}
