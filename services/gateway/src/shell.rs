//! What every event loop does around its core the same way: it drains the worker's mail
//! (a connected link's socket it takes itself, everything else goes to the core) and sends
//! the core's player store lookups. The loops call it; it calls only the core's door.

use std::time::Instant;

use crate::core::{Core, Endpoint};
use crate::shared::{AccountAnswer, CoreMail, Inbox, Mail};
use crate::uplink::LinkUp;

/// Hands the core everything in the worker's inbox; `link_up` takes each connected link.
pub fn take_mail(core: &mut Core, inbox: &Inbox, now: Instant, mut link_up: impl FnMut(LinkUp)) {
    inbox.drain_start();
    while let Some(mail) = inbox.try_recv() {
        match mail {
            Mail::LinkUp(up) => link_up(up),
            Mail::Core(mail) => core.handle_mail(now, mail),
        }
    }
}

/// Sends the player store lookups the core asked for. One the store's queue has no room
/// for is answered `Busy` at once (the login is refused, and may be tried again).
pub fn send_account_requests(core: &mut Core, inbox: &Inbox, now: Instant) {
    while let Some(request) = core.poll_account_request() {
        let session = request.session;
        if !inbox.ask_store(request) {
            core.handle_mail(now, CoreMail::Account { session, answer: AccountAnswer::Busy });
        }
    }
}

/// What is still to be written to an endpoint: the rest of `out` past `written`, or, all of
/// it written, the next bytes the core has for it (taken into `out`, reusing its buffer).
/// Empty when there is nothing to write.
pub fn unwritten<'a>(
    core: &mut Core,
    endpoint: Endpoint,
    out: &'a mut Vec<u8>,
    written: &mut usize,
) -> &'a [u8] {
    if *written == out.len() {
        out.clear();
        *written = 0;
        core.take_output(endpoint, out);
    }
    &out[*written..]
}
