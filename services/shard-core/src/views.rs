//! Exact client views across a handoff: a client just handed in is told the difference
//! between what it was told and this shard's world (kept in [`Divergent`]) until the two
//! agree. See `history` for what that difference is computed from.
//!
//! A function of the parts it reads and writes (the world, the history, the outbox), called
//! by `ShardCore` alone, which owns the divergent clients.

use std::collections::BTreeSet;

use meridian_protocol::server;
use meridian_world::{PlayerId, Position};

use std::time::Instant;

use meridian_world::World;

use crate::history::{Divergent, History, Told, CONVERGE_LIMIT};
use crate::outbox::Outbox;
use crate::types::LinkId;

/// Brings a divergent client's view toward the world: everything the world has caught up
/// with is sent to the client's `link` and `session` (replayed step by step where
/// possible); what the world is still behind on waits. The client returns to the normal
/// path once nothing waits: what comes back is what still waits, if anything.
pub(crate) fn resync(
    observer: PlayerId,
    mut divergent: Divergent,
    (link, session): (LinkId, u64),
    (world, history): (&World, &History),
    outbox: &mut Outbox,
    now: Instant,
) -> Option<Divergent> {
    let me = world.position(observer)?;
    let force = now.saturating_duration_since(divergent.since) > CONVERGE_LIMIT;
    let range = world.config().view_range;
    let sees = |at: Position| me.x.abs_diff(at.x) <= range && me.y.abs_diff(at.y) <= range;
    let mut visible = Vec::new();
    world.visible_to(observer, &mut visible);
    let subjects: BTreeSet<PlayerId> =
        visible.iter().copied().chain(divergent.told.keys().copied()).collect();
    let mut waiting = false;
    for subject in subjects {
        let want = if visible.contains(&subject) { world.position(subject) } else { None };
        let version = history.version(subject);
        let mut have = divergent.told.get(&subject).copied();
        if let Some(told) = have.filter(|told| told.gone) {
            // The client was told this player left the world. A copy here of that
            // state or an older one is on its way out: wait for it, say nothing.
            let stale = version.is_none_or(|version| version <= told.version);
            match want {
                Some(_) if stale && !force => {
                    waiting = true;
                    continue;
                }
                // Back in the world since (a resume): it enters as anyone would.
                Some(_) => {
                    divergent.told.remove(&subject);
                    have = None;
                }
                None => {
                    divergent.told.remove(&subject);
                    continue;
                }
            }
        }
        let behind = !force
            && match (version, have) {
                // Dropped here for being out of reach: what this world last had says
                // nothing about where the player is now. One the client sees where it can
                // still see it will come back as a ghost; wait for it rather than say Left.
                // One told at a cell out of the client's sight now is not coming back.
                (Some(version), Some(told)) if history.out_of_reach(subject) => {
                    sees(told.at) && (told.seen || version < told.version)
                }
                (Some(version), Some(told)) => version < told.version,
                // Unknown here and in view where the client last saw it: its ghost is on
                // its way. Unknown and only near, or seen where the client is out of sight
                // of it now: its owner mirrors it nowhere near; nothing to wait for (it
                // leaves the view; seed 103654 waited the 3 s for a copy never coming).
                (None, Some(told)) => told.seen && sees(told.at),
                _ => false,
            };
        if behind {
            waiting = true;
            continue;
        }
        // Entered with the entity's game kind and public state, as the world's own.
        let look = world.look(subject);
        let enter = |at: Position| match &look {
            Some(look) => {
                server::entered_as(subject.0, at.x, at.y, &*look.name, look.kind, &look.state)
            }
            None => server::entered(subject.0, at.x, at.y, ""),
        };
        match (have, want) {
            (None, None) => {}
            (None, Some(at)) => {
                // The client does not have it. If this world saw it come into sight,
                // it enters where it did and walks on from there, as in one world.
                let walk = history.walk_into_sight(subject, sees).unwrap_or_default();
                let (first, then) = walk.split_first().map_or((at, &[][..]), |(e, t)| (*e, t));
                outbox.push(link, session, &enter(first));
                for step in then {
                    outbox.push(link, session, &server::moved(subject.0, step.x, step.y, 0));
                }
                let version = version.unwrap_or_default();
                divergent.told.insert(subject, Told { at, version, seen: true, gone: false });
            }
            (Some(told), want) => {
                // Replay what the world has after the told state, one cell at a time.
                let mut seen = told.seen.then_some(told.at);
                let steps = history.steps_after(subject, told.version, told.at).unwrap_or_default();
                for step in steps {
                    let message = match (seen, sees(step)) {
                        (Some(last), true) if last != step => {
                            Some(server::moved(subject.0, step.x, step.y, 0))
                        }
                        (Some(_), true) | (None, false) => None,
                        (Some(_), false) => {
                            tracing::debug!(%observer, %subject, ?step, "resync: replayed left");
                            Some(server::left(subject.0))
                        }
                        (None, true) => Some(enter(step)),
                    };
                    seen = sees(step).then_some(step);
                    if let Some(message) = message {
                        outbox.push(link, session, &message);
                    }
                }
                // Whatever the history could not cover: end where the world is.
                let last = match (seen, want) {
                    (Some(last), Some(at)) if last.x.abs_diff(at.x) + last.y.abs_diff(at.y) > 1 => {
                        // Never a jump (see the world's view diffs): it leaves and
                        // enters again where the world has it.
                        tracing::debug!(%observer, %subject, ?last, ?at, force, ?version, ?told, "resync: no history to replay; left and entered again");
                        outbox.push(link, session, &server::left(subject.0));
                        Some(enter(at))
                    }
                    (Some(last), Some(at)) if last != at => {
                        Some(server::moved(subject.0, at.x, at.y, 0))
                    }
                    (None, Some(at)) => Some(enter(at)),
                    (Some(_), None) => {
                        tracing::debug!(%observer, %subject, force, ?version, ?told, "resync: left");
                        Some(server::left(subject.0))
                    }
                    _ => None,
                };
                if let Some(message) = last {
                    outbox.push(link, session, &message);
                }
                match want {
                    Some(at) => {
                        let version = version.unwrap_or(told.version);
                        divergent
                            .told
                            .insert(subject, Told { at, version, seen: true, gone: false });
                    }
                    None => {
                        divergent.told.remove(&subject);
                    }
                }
            }
        }
    }
    if waiting {
        return Some(divergent);
    }
    None
}
