//! The core's handoffs part: players that left here for another shard, and players that
//! are on their way in but must wait.
//!
//! It keeps the players handed off from here (where their late inputs go, kept
//! `FORWARD_FOR`; listed in the report until a second after the new owner confirmed), the
//! handoffs that wait for their gateway lane to open a link here (10 s at most, 65,536 at
//! most), and the restores that wait for this shard's view to reach the partition their
//! gateway chose this shard by (2 s at most). [`told_view`] says what a player being
//! handed off from here has been told, for its new owner.
//!
//! Only `ShardCore` calls it (`handover.rs` and `resume.rs` decide when a player goes or comes): it keeps
//! and expires what waits and hands it back when it may go; it sends nothing itself.

use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

use meridian_cluster::ShardId;
use meridian_rpc::pb::{Handoff, Join, ViewEntry};
use meridian_world::{PlayerId, Position, World};
use tracing::warn;

use crate::history::{Divergent, History};
use crate::inputs::{FORWARD_FOR, FORWARD_QUIET};
use crate::messages::wire;
use crate::types::{GatewayLane, HandedOff, LinkId};

/// Handoffs waiting for their player's gateway to open a stream here, at most; and how
/// long one waits. Past either, the handoff is given up with a warning, and its player is
/// in no shard: nothing tells its gateway (a gateway that cannot reach a region owner
/// for 10 s has lost that region's players already).
const AWAITING_GATEWAY_LIMIT: usize = 65_536;
const AWAITING_GATEWAY_FOR: Duration = Duration::from_secs(10);
/// How long a restore chosen by a newer partition waits for this shard's watch to catch up
/// before it is taken by the map this shard has.
const BEHIND_VIEW_WAIT: Duration = Duration::from_secs(2);

/// A handoff waiting for its gateway's stream: from whom, which player, its generation,
/// the handoff, and since when.
pub(crate) type AwaitingHandoff = (ShardId, PlayerId, u64, Handoff, Instant);

/// What a player seated on a new session is told first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A restore or resume: the client's view starts over.
    ViewReset,
    /// A login that took the player over from another connection.
    LoginOk,
}

/// A restore waiting for this shard's view to reach the gateway's epoch.
pub(crate) struct BehindView {
    pub since: Instant,
    pub link: LinkId,
    pub seq: u64,
    pub session: u64,
    pub player: PlayerId,
    pub join: Join,
    pub answer: Answer,
}

#[derive(Default)]
pub(crate) struct Handoffs {
    handed_off: FxHashMap<PlayerId, HandedOff>,
    /// Handoffs whose player's gateway lane has no link here yet, by that lane.
    awaiting_gateway: FxHashMap<GatewayLane, Vec<AwaitingHandoff>>,
    /// Restores a gateway chose this shard for by a newer partition than this shard has
    /// seen: they wait for the watch to catch up.
    behind_view: Vec<BehindView>,
}

impl Handoffs {
    /// Where `player`, handed off from here, went (and what is kept about it).
    pub fn handed(&self, player: PlayerId) -> Option<&HandedOff> {
        self.handed_off.get(&player)
    }

    pub fn handed_mut(&mut self, player: PlayerId) -> Option<&mut HandedOff> {
        self.handed_off.get_mut(&player)
    }

    /// `player` was handed off from here.
    pub fn handed_off(&mut self, player: PlayerId, handed: HandedOff) {
        self.handed_off.insert(player, handed);
    }

    /// `player` is back here: what was kept about its handoff from here, if any.
    pub fn returned(&mut self, player: PlayerId) -> Option<HandedOff> {
        self.handed_off.remove(&player)
    }

    /// Handoffs from here the new owner has not confirmed yet.
    pub fn unconfirmed(&self) -> usize {
        self.handed_off.values().filter(|h| h.acked.is_none()).count()
    }

    /// Whether every handoff from here is `FORWARD_QUIET` old.
    pub fn quiet(&self, now: Instant) -> bool {
        self.handed_off.values().all(|h| now.saturating_duration_since(h.since) >= FORWARD_QUIET)
    }

    /// The players handed off from here, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&PlayerId, &HandedOff)> {
        self.handed_off.iter()
    }

    /// A handoff waits for its gateway lane's link here.
    pub fn wait_for_lane(&mut self, lane: GatewayLane, waiting: AwaitingHandoff) {
        self.awaiting_gateway.entry(lane).or_default().push(waiting);
    }

    /// The lane's link opened: the handoffs that waited for it, in arrival order.
    pub fn lane_opened(&mut self, lane: GatewayLane) -> Vec<AwaitingHandoff> {
        self.awaiting_gateway.remove(&lane).unwrap_or_default()
    }

    /// A restore waits for this shard's view to catch up.
    pub fn wait_for_view(&mut self, waiting: BehindView) {
        self.behind_view.push(waiting);
    }

    /// The restores that may go now: the view has reached their epoch, or they waited long
    /// enough; in the order they came.
    pub fn due_behind_view(&mut self, epoch: u64, now: Instant) -> Vec<BehindView> {
        if self.behind_view.is_empty() {
            return Vec::new();
        }
        let (due, waiting): (Vec<BehindView>, Vec<BehindView>) =
            std::mem::take(&mut self.behind_view).into_iter().partition(|w| {
                w.join.epoch <= epoch || now.saturating_duration_since(w.since) >= BEHIND_VIEW_WAIT
            });
        self.behind_view = waiting;
        due
    }

    /// Forgets handoffs from here older than `FORWARD_FOR`.
    pub fn expire_handed_off(&mut self, now: Instant) {
        self.handed_off.retain(|_, h| now - h.since < FORWARD_FOR);
    }

    /// Gives up the handoffs that waited too long for their gateway's stream, and the
    /// oldest beyond [`AWAITING_GATEWAY_LIMIT`]: a gateway that never opens a stream here
    /// must not make this shard hold handoffs for ever.
    pub fn expire_awaiting_gateway(&mut self, now: Instant) {
        let mut waiting = 0;
        self.awaiting_gateway.retain(|waits_for, handoffs| {
            handoffs.retain(|(from, player, .., since)| {
                let keep = now.saturating_duration_since(*since) < AWAITING_GATEWAY_FOR;
                if !keep {
                    let (gateway, lane) = (waits_for.gateway, waits_for.lane);
                    warn!(%player, %from, gateway, lane, "handoff gave up waiting for its gateway lane's link");
                }
                keep
            });
            waiting += handoffs.len();
            !handoffs.is_empty()
        });
        while waiting > AWAITING_GATEWAY_LIMIT {
            let oldest = self
                .awaiting_gateway
                .iter()
                .filter_map(|(waits_for, handoffs)| Some((handoffs.first()?.4, *waits_for)))
                .min();
            let Some((_, waits_for)) = oldest else { break };
            if let Some(handoffs) = self.awaiting_gateway.get_mut(&waits_for) {
                let (from, player, ..) = handoffs.remove(0);
                let (gateway, lane) = (waits_for.gateway, waits_for.lane);
                warn!(%player, %from, gateway, lane, "too many handoffs waiting for gateways; oldest given up");
                if handoffs.is_empty() {
                    self.awaiting_gateway.remove(&waits_for);
                }
            }
            waiting -= 1;
        }
    }

    /// Forgets the handoffs from here (the shard was taken for dead and starts over; what
    /// waits to come in still may).
    pub fn clear_handed_off(&mut self) {
        self.handed_off.clear();
    }

    /// Players handed off from here, and handoffs waiting for a gateway lane.
    pub fn sizes(&self) -> (usize, usize) {
        (self.handed_off.len(), self.awaiting_gateway.values().map(Vec::len).sum())
    }
}

/// What a player being handed off from here has been told, for its new owner: if its view
/// is still being reconciled after an earlier handoff (`divergent`), exactly what it was
/// told so far; otherwise the world's view.
pub(crate) fn told_view(
    player: PlayerId,
    at: Position,
    divergent: Option<Divergent>,
    world: &World,
    history: &History,
) -> Vec<ViewEntry> {
    let mut view: Vec<ViewEntry> = match divergent {
        Some(divergent) => divergent
            .told
            .iter()
            .map(|(id, told)| ViewEntry {
                player_id: id.0,
                position: wire(told.at),
                generation: told.version.0,
                subject_seq: told.version.1,
                seen: told.seen,
                gone: told.gone,
            })
            .collect(),
        None => {
            // Everyone within two cells beyond sight: those in view, and those that may
            // come into view while the new owner's copies of them are catching up.
            let range = world.config().view_range;
            let mut near = Vec::new();
            world.within(at, range + 2, &mut near);
            near.iter()
                .filter(|id| **id != player)
                .filter_map(|id| {
                    let position = world.position(*id)?;
                    let (generation, subject_seq) = history.version(*id).unwrap_or_default();
                    let seen =
                        position.x.abs_diff(at.x) <= range && position.y.abs_diff(at.y) <= range;
                    Some(ViewEntry {
                        player_id: id.0,
                        position: wire(position),
                        generation,
                        subject_seq,
                        seen,
                        gone: false,
                    })
                })
                .collect()
        }
    };
    // Those that left the world lately near here: the client was told so, and the new
    // owner may not have removed them yet.
    let range = world.config().view_range + 2;
    for (id, left, (generation, subject_seq)) in history.departed_near(at, range) {
        if id != player && !view.iter().any(|entry| entry.player_id == id.0) {
            view.push(ViewEntry {
                player_id: id.0,
                position: wire(left),
                generation,
                subject_seq,
                seen: false,
                gone: true,
            });
        }
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handed(since: Instant, acked: Option<Instant>) -> HandedOff {
        HandedOff {
            to: ShardId(2),
            incarnation: 1,
            generation: 1,
            at: Position { x: 1, y: 1 },
            acked,
            since,
            forwarded: Vec::new(),
            npc: false,
        }
    }

    fn restore(epoch: u64, since: Instant, player: u64) -> BehindView {
        let join = Join { epoch, restore: true, ..Join::default() };
        let (link, seq, session, answer) = (LinkId(1), 1, 1, Answer::ViewReset);
        BehindView { since, link, seq, session, player: PlayerId(player), join, answer }
    }

    #[test]
    fn handoffs_from_here_are_confirmed_go_quiet_and_are_forgotten() {
        let (mut handoffs, now) = (Handoffs::default(), Instant::now());
        handoffs.handed_off(PlayerId(1), handed(now, None));
        handoffs.handed_off(PlayerId(2), handed(now, Some(now)));
        assert_eq!(handoffs.unconfirmed(), 1);
        assert!(!handoffs.quiet(now) && handoffs.quiet(now + FORWARD_QUIET));
        handoffs.expire_handed_off(now + FORWARD_FOR - Duration::from_millis(1));
        assert_eq!(handoffs.sizes(), (2, 0));
        handoffs.expire_handed_off(now + FORWARD_FOR);
        assert_eq!(handoffs.sizes(), (0, 0));
    }

    #[test]
    fn handoffs_wait_for_their_lane_until_it_opens_or_for_ten_seconds() {
        let (mut handoffs, now) = (Handoffs::default(), Instant::now());
        let (lane, other) =
            (GatewayLane { gateway: 1, lane: 0 }, GatewayLane { gateway: 1, lane: 1 });
        handoffs.wait_for_lane(lane, (ShardId(2), PlayerId(5), 1, Handoff::default(), now));
        handoffs.wait_for_lane(other, (ShardId(2), PlayerId(6), 1, Handoff::default(), now));
        let opened = handoffs.lane_opened(lane);
        assert_eq!(opened.iter().map(|w| w.1).collect::<Vec<_>>(), [PlayerId(5)]);
        handoffs.expire_awaiting_gateway(now + AWAITING_GATEWAY_FOR - Duration::from_millis(1));
        assert_eq!(handoffs.sizes().1, 1);
        handoffs.expire_awaiting_gateway(now + AWAITING_GATEWAY_FOR);
        assert_eq!(handoffs.sizes().1, 0, "given up");
        assert!(handoffs.lane_opened(other).is_empty());
    }

    #[test]
    fn restores_behind_the_view_go_when_it_catches_up_or_after_two_seconds() {
        let (mut handoffs, now) = (Handoffs::default(), Instant::now());
        handoffs.wait_for_view(restore(5, now, 1));
        handoffs.wait_for_view(restore(7, now, 2));
        handoffs.wait_for_view(restore(6, now, 3));
        let players = |due: Vec<BehindView>| due.iter().map(|w| w.player.0).collect::<Vec<_>>();
        assert_eq!(players(handoffs.due_behind_view(4, now)), Vec::<u64>::new());
        assert_eq!(players(handoffs.due_behind_view(6, now)), [1, 3]);
        assert_eq!(players(handoffs.due_behind_view(6, now + BEHIND_VIEW_WAIT)), [2]);
    }
}
