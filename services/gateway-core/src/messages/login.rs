//! `Login`: the token checked (or, in dev mode, the name taken as the account), the
//! account's player looked up in the player store when there is one (the request goes out
//! through [`crate::Core::poll_account_request`], the answer comes back as mail), a
//! player online elsewhere taken over, and a new or saved player placed on a shard.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use meridian_protocol::pb::ErrorCode;
use meridian_protocol::validate_name;
use meridian_rpc::pb::{player_input::Kind as Input, Join, ResumeRequest};
use tracing::debug;

use super::super::conn::{PendingLogin, Takeover, ID_TRIES};
use super::super::{Conn, Ctx, Session};
use crate::accounts::{Account, TokenError};
use crate::routing::ShardLink;
use crate::shared::{session_id, AccountAnswer};
use crate::Placement;

impl Ctx {
    pub(crate) fn login(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        login: meridian_protocol::pb::Login,
    ) {
        if !matches!(conn.session, Session::Anonymous) || conn.pending_login.is_some() {
            return self.refuse(conn, slot, ErrorCode::AlreadyLoggedIn, "already logged in", 0);
        }
        let dev_mode = self.shared.config.dev_mode;
        let tokens = &self.shared.metrics.login_tokens;
        let account = if login.token.is_empty() {
            if !dev_mode {
                tokens.inc("missing");
                let detail = "a login token is required (Login.token, from your login service)";
                return self.refuse(conn, slot, ErrorCode::InvalidToken, detail, 0);
            }
            // Dev mode: the account is the name the client gives.
            Account { id: login.name.clone(), name: None }
        } else {
            let unix_now = self.shared.clock.unix_at(self.now);
            match self.shared.login_keys.keys().verify(&login.token, unix_now) {
                Ok(account) => {
                    tokens.inc("ok");
                    account
                }
                Err(error) => {
                    let expired = matches!(error, TokenError::Expired | TokenError::NotYetValid);
                    tokens.inc(if expired { "expired" } else { "invalid" });
                    return self.refuse(conn, slot, ErrorCode::InvalidToken, &error.to_string(), 0);
                }
            }
        };
        // The token's display name, when it gives one, is the player's name.
        let login = meridian_protocol::pb::Login {
            name: account.name.clone().unwrap_or(login.name),
            ..login
        };
        // The name is stored and shown normalised; in dev mode it is also the account, so
        // "ＡＢＣ" logs in as the account "ABC", not as a second player named "ABC".
        let name = match validate_name(&login.name) {
            Ok(name) => name,
            Err(invalid) => {
                return self.refuse(conn, slot, invalid.code(), &invalid.to_string(), 0)
            }
        };
        let account =
            if login.token.is_empty() { Account { id: name.clone(), name: None } } else { account };
        let login = meridian_protocol::pb::Login { name, ..login };
        debug!(account = %account.id, name = %login.name, "login");
        // When the login was taken: of two racing logins of one account, the later wins.
        conn.login_stamp = self.login_stamp();
        let spawn = login.spawn.filter(|_| dev_mode);
        if self.shared.config.store {
            let pending = PendingLogin { account: account.id, name: login.name, spawn, tries: 0 };
            return self.ask_store(conn, slot, pending);
        }
        let Some(player) = self.next_player_id() else {
            return self.refuse(conn, slot, ErrorCode::Unavailable, "no player ids available", 0);
        };
        self.place(conn, slot, session, player, login.name, spawn, 0);
    }

    /// Asks the player store for the account's player; the answer comes as mail.
    pub(crate) fn ask_store(&mut self, conn: &mut Conn, slot: u32, pending: PendingLogin) {
        let Some(new_id) = self.next_player_id() else {
            return self.refuse(conn, slot, ErrorCode::Unavailable, "no player ids available", 0);
        };
        let session = session_id(self.worker, slot, conn.generation_slot);
        let request = crate::shared::AccountRequest {
            worker: self.worker,
            session,
            account: pending.account.clone(),
            name: pending.name.clone(),
            new_id,
        };
        // The shell sends it; should the store's queue be full, it answers `Busy`.
        self.account_requests.push_back(request);
        conn.pending_login = Some(pending);
    }

    /// The player store answered a login.
    pub(crate) fn account_answer(&mut self, conn: &mut Conn, slot: u32, answer: AccountAnswer) {
        let Some(mut pending) = conn.pending_login.take() else { return };
        if !matches!(conn.session, Session::Anonymous) {
            return;
        }
        let session = session_id(self.worker, slot, conn.generation_slot);
        let metrics = &self.shared.metrics.store_lookups;
        match answer {
            AccountAnswer::Player(player) => {
                metrics.inc("ok");
                let size = self.routing().read(|t| t.map_size());
                let saved =
                    player.saved.as_ref().map(|s| s.at).filter(|&(x, y)| {
                        size.is_some_and(|(width, height)| x < width && y < height)
                    });
                let saved = saved.map(|(x, y)| meridian_protocol::pb::Position { x, y });
                // After the generation it was saved at: its saves from now on are newer.
                let generation = player.saved.as_ref().map_or(0, |s| s.generation + 1);
                conn.state = player.state;
                // One account is online once: if a shard holds its player (another
                // connection's, or parked), that shard hands it to this connection.
                let login = Takeover { name: player.name, spawn: pending.spawn, saved, generation };
                self.take_over(conn, slot, session, player.player_id, login);
            }
            AccountAnswer::IdTaken if pending.tries + 1 < ID_TRIES => {
                pending.tries += 1;
                self.ask_store(conn, slot, pending);
            }
            AccountAnswer::IdTaken => {
                metrics.inc("unavailable");
                let detail = "no free player id for a new account";
                self.refuse(conn, slot, ErrorCode::Unavailable, detail, 0);
            }
            AccountAnswer::Busy => {
                self.shared.metrics.store_lookups.inc("busy");
                let detail = "too many logins waiting for the player store; try again";
                self.refuse(conn, slot, ErrorCode::Unavailable, detail, 0);
            }
            AccountAnswer::Unavailable(why) => {
                metrics.inc("unavailable");
                let detail = format!("player store unavailable: {why}");
                self.refuse(conn, slot, ErrorCode::Unavailable, &detail, 0);
            }
        }
    }

    /// A login of an account whose player may be online: every shard is asked whether it
    /// holds the player (see [`Takeover`]).
    pub(super) fn take_over(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        player: u64,
        login: Takeover,
    ) {
        let links: Vec<Arc<ShardLink>> =
            self.routing().read(|t| t.links.iter().filter(|l| l.is_up()).cloned().collect());
        if links.is_empty() {
            return self.refuse(conn, slot, ErrorCode::Unavailable, "no shard available", 0);
        }
        let seq = conn.take_seq();
        let request = ResumeRequest {
            login: true,
            name: login.name.clone(),
            spawn: login.spawn,
            login_stamp: conn.login_stamp,
            ..Default::default()
        };
        for link in &links {
            self.relay(link, session, player, seq, Input::Resume(request.clone()));
        }
        let since = self.now;
        let login = Some(Box::new(login));
        conn.session = Session::Resuming { player, waiting: links.len(), since, login };
    }

    /// Places a logged-in player: on the owner of `spawn` if given, else by the placement
    /// policy; the Join goes to that shard.
    pub(crate) fn place(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        player: u64,
        name: String,
        spawn: Option<meridian_protocol::pb::Position>,
        generation: u64,
    ) {
        let placed = self.routing().read(|table| {
            if let Some(spawn) = spawn {
                let (width, height) = table.map_size()?;
                if spawn.x >= width || spawn.y >= height {
                    return Some(Err((spawn, width, height)));
                }
                return table.owner_link(spawn.x, spawn.y).filter(|l| l.is_up()).cloned().map(Ok);
            }
            let owns_a_region = |l: &ShardLink| {
                table.partition.as_ref().is_some_and(|p| p.regions_of(l.id).next().is_some())
            };
            let open: Vec<&Arc<ShardLink>> =
                table.links.iter().filter(|l| l.takes_players() && owns_a_region(l)).collect();
            if open.is_empty() {
                return None;
            }
            let chosen = match self.shared.config.placement {
                Placement::RoundRobin => {
                    let turn = self.shared.round_robin.fetch_add(1, Ordering::Relaxed);
                    open[turn % open.len()]
                }
                Placement::LeastLoaded => open
                    .iter()
                    .min_by_key(|l| (l.load(), l.id))
                    .expect("invariant: open is not empty"),
            };
            chosen.add_load();
            Some(Ok(Arc::clone(chosen)))
        });
        let link = match placed {
            None => {
                return self.refuse(conn, slot, ErrorCode::Unavailable, "no shard available", 0)
            }
            Some(Err((spawn, width, height))) => {
                let invalid = meridian_protocol::InvalidArgument::SpawnOutsideMap {
                    x: spawn.x,
                    y: spawn.y,
                    width,
                    height,
                };
                return self.refuse(conn, slot, invalid.code(), &invalid.to_string(), 0);
            }
            Some(Ok(link)) => link,
        };
        self.shared.metrics.logins.inc();
        self.relay(
            &link,
            session,
            player,
            conn.take_seq(),
            Input::Join(Join {
                name: name.clone(),
                spawn,
                restore: false,
                generation,
                gateway_id: 0,
                epoch: self.routing().read(|t| t.epoch()),
                state: conn.state.clone(),
                login_stamp: conn.login_stamp,
                budgets: None,
            }),
        );
        conn.name = name;
        conn.generation = generation;
        conn.take_kept_budgets(&self.shared.admission, player, self.now);
        conn.session = Session::Playing { player, link };
    }

    /// This login's `Join.login_stamp`: now in Unix milliseconds, this gateway's id below.
    fn login_stamp(&self) -> u64 {
        let ms = self.shared.clock.unix_ms_at(self.now);
        (ms << 16) | u64::from(self.shared.config.gateway.0 & 0xffff)
    }

    pub(super) fn next_player_id(&mut self) -> Option<u64> {
        if self.ids.is_empty() {
            self.ids = self.shared.ids.take_block()?;
        }
        self.ids.next()
    }
}
