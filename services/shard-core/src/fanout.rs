//! A step's envelopes (one per viewer and notification) turned into frames on their
//! viewers' connections: the per-notification path of a battle (issue 29).

use meridian_protocol::server;
use meridian_world::Notification;

use crate::core::ShardCore;
use crate::game_slot::game_notification;

impl ShardCore {
    /// Turns the world's envelopes into frames for their recipients' connections.
    pub(crate) fn route_envelopes(&mut self) {
        self.routes.begin(self.roster.version(), self.outbox.round());
        for envelope in self.envelopes.drain(..) {
            // (Checked for emptiness first: this runs per notification, and most rounds have
            // no client mid-handoff.)
            let divergent =
                if self.roster.any_divergent() { self.roster.divergent(envelope.to) } else { None };
            if let Some(divergent) = divergent {
                if !self.roster.is_seated(envelope.to) {
                    continue;
                }
                // A client just handed in gets its view from the told-vs-world difference;
                // only its own acks go through as they are, and chat from itself and from
                // speakers it has been told it sees (others are not in its view yet, or no
                // longer).
                match &envelope.note {
                    Notification::Moved { subject, .. } if *subject == envelope.to => {}
                    Notification::Chat { speaker: subject, .. }
                    | Notification::StateChanged { subject, .. }
                    | Notification::Event { source: subject, .. } => {
                        // One-off news about a subject the client has been told it sees
                        // (an Entered still to come carries the current state anyway).
                        let seen = *subject == envelope.to
                            || divergent.told.get(subject).is_some_and(|told| told.seen);
                        if !seen {
                            continue;
                        }
                    }
                    _ => {
                        self.resync_due.push(envelope.to);
                        continue;
                    }
                }
            }
            let note = envelope.note;
            if let Notification::Moved { subject, position, client_time } = &note {
                if *subject == envelope.to {
                    let Some(seat) = self.roster.seat(envelope.to) else { continue };
                    let (link, session, generation) = (seat.link, seat.session, seat.generation);
                    // The mover's own ack: counted so the gateway knows it is answered, and
                    // its position kept there in case this shard dies.
                    let message = server::moved(subject.0, position.x, position.y, *client_time);
                    self.outbox.push_move_answer(link, session, &message);
                    self.outbox.track(link, session, position.x, position.y, generation);
                    continue;
                }
            }
            // Where the viewer's output is: from the route cache, else from its seat.
            let route = match self.routes.get(envelope.to) {
                Some(route) => route,
                None => {
                    let Some(seat) = self.roster.seat(envelope.to) else { continue };
                    let route = self.outbox.route(seat.link, seat.session, &seat.outbox);
                    self.routes.put(envelope.to, route);
                    route
                }
            };
            debug_assert!(
                self.roster.seat(envelope.to).is_some_and(|seat| {
                    self.outbox.route(seat.link, seat.session, &seat.outbox) == route
                }),
                "a cached route is the seat's"
            );
            // The same notification for viewer after viewer (a mover's `Moved` goes to all
            // who see it in a row): encoded once, copied to each.
            self.outbox.push_shared_at(route, &note, || match &note {
                Notification::Entered { subject, position, name, kind, state } => Some(
                    server::entered_as(subject.0, position.x, position.y, &**name, *kind, state),
                ),
                Notification::Moved { subject, position, client_time } => {
                    Some(server::moved(subject.0, position.x, position.y, *client_time))
                }
                Notification::Left { subject } => Some(server::left(subject.0)),
                Notification::Chat { speaker, text } => Some(server::chat(speaker.0, &**text)),
                Notification::StateChanged { .. } | Notification::Event { .. } => {
                    game_notification(&note)
                }
            });
        }
    }
}
