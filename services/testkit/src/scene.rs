//! A small world of named bots whose every step is checked against the single-world rules:
//! after each login, move, chat or logout, every bot must receive exactly what one server
//! running the whole world would send it (DESIGN.md section 1), in any order per bot, and
//! nothing else. For scripted, deterministic scenarios such as walking a bot around a shard
//! corner while others watch.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use meridian_protocol::pb::{Direction, ServerMessage};
use meridian_protocol::server;

use crate::bot::Bot;
use crate::msg;
use crate::stream::{chebyshev, step_clamped};
use crate::wait::{deadline, DEFAULT_WAIT};

struct Member {
    bot: Bot,
    name: String,
    at: (u32, u32),
    next_client_time: u64,
    last_move: Option<Instant>,
    online: bool,
}

/// The shortest time between two moves of one member: at most 20 a second, the default
/// limit, however fast the checks go.
const MIN_MOVE_GAP: Duration = Duration::from_millis(50);

/// Bots in one world and where each one is.
pub struct Scene {
    view_range: u32,
    map: (u32, u32),
    members: Vec<Member>,
}

impl Scene {
    pub fn new(map: (u32, u32), view_range: u32) -> Scene {
        Scene { view_range, map, members: Vec::new() }
    }

    fn sees(&self, a: (u32, u32), b: (u32, u32)) -> bool {
        chebyshev(a, b) <= self.view_range
    }

    /// The bot of member `who` (its index, in login order).
    pub fn bot(&mut self, who: usize) -> &mut Bot {
        &mut self.members[who].bot
    }

    pub fn position(&self, who: usize) -> (u32, u32) {
        self.members[who].at
    }

    pub fn name(&self, who: usize) -> &str {
        &self.members[who].name
    }

    fn online_others(&self, who: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.members.len()).filter(move |&i| i != who && self.members[i].online)
    }

    fn entered_of(&self, who: usize) -> ServerMessage {
        let m = &self.members[who];
        server::entered(m.bot.id(), m.at.0, m.at.1, m.name.clone())
    }

    /// Connects to `addr` and logs in as `name` at `at` (stream checks on). The new bot
    /// must get `Entered` for exactly those in its sight, and each of those an `Entered`
    /// for it. Returns its index.
    pub fn login(&mut self, addr: SocketAddr, name: &str, at: (u32, u32)) -> anyhow::Result<usize> {
        let mut bot = Bot::connect(addr)?;
        bot.check_streams();
        let login = bot.login(name, Some(at))?;
        let got_at = login.ok.position.as_ref().map(|p| (p.x, p.y));
        if got_at != Some(at) {
            bail!("{name} logged in at {got_at:?}, asked for {at:?}");
        }
        let who = self.members.len();
        self.members.push(Member {
            bot,
            name: name.to_string(),
            at,
            next_client_time: 1,
            last_move: None,
            online: true,
        });
        let in_sight: Vec<usize> =
            self.online_others(who).filter(|&i| self.sees(self.members[i].at, at)).collect();
        let expected: Vec<ServerMessage> = in_sight.iter().map(|&i| self.entered_of(i)).collect();
        // What came with the login, and whatever of the rest follows it.
        let mut missing = expected.clone();
        let mut unexpected = Vec::new();
        for message in login.after {
            match missing.iter().position(|m| *m == message) {
                Some(i) => {
                    missing.remove(i);
                }
                None => unexpected.push(message),
            }
        }
        if !unexpected.is_empty() {
            bail!("{name} logging in at {at:?} got {unexpected:?}, expected only {expected:?}");
        }
        self.members[who]
            .bot
            .expect_messages(&missing)
            .with_context(|| format!("{name} logging in at {at:?}: Entered of those in sight"))?;
        let announced = self.entered_of(who);
        for i in self.online_others(who).collect::<Vec<_>>() {
            let expect: Vec<ServerMessage> =
                if in_sight.contains(&i) { vec![announced.clone()] } else { Vec::new() };
            let observer = &mut self.members[i];
            observer.bot.expect_messages(&expect).with_context(|| {
                format!("{} at {:?} when {name} logged in at {at:?}", observer.name, observer.at)
            })?;
        }
        Ok(who)
    }

    /// Member `who` moves one step; everyone must get exactly the single-world effects: the
    /// mover its ack and `Entered`/`Left` for those its move brings into or out of sight,
    /// each other bot `Moved`, `Entered`, `Left` or nothing.
    pub fn step(&mut self, who: usize, direction: Direction) -> anyhow::Result<()> {
        let from = self.members[who].at;
        let to = step_clamped(from, direction, self.map);
        let t = self.members[who].next_client_time;
        self.members[who].next_client_time += 1;
        let mover_id = self.members[who].bot.id();
        if let Some(last) = self.members[who].last_move {
            // Pacing under the rate limit, not waiting for anything to happen.
            let next = last + MIN_MOVE_GAP;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
        }
        self.members[who].last_move = Some(Instant::now());
        self.members[who].bot.send_move(direction, t)?;

        let mut for_mover = vec![server::moved(mover_id, to.0, to.1, t)];
        let mut for_others: Vec<(usize, Vec<ServerMessage>)> = Vec::new();
        let others: Vec<usize> = self.online_others(who).collect();
        for &i in &others {
            let at = self.members[i].at;
            let (before, after) = (self.sees(from, at), self.sees(to, at));
            let mut expect = Vec::new();
            if to != from {
                match (before, after) {
                    (true, true) => expect.push(server::moved(mover_id, to.0, to.1, 0)),
                    (false, true) => {
                        expect.push(server::entered(
                            mover_id,
                            to.0,
                            to.1,
                            self.members[who].name.clone(),
                        ));
                        for_mover.push(self.entered_of(i));
                    }
                    (true, false) => {
                        expect.push(server::left(mover_id));
                        for_mover.push(server::left(self.members[i].bot.id()));
                    }
                    (false, false) => {}
                }
            }
            for_others.push((i, expect));
        }
        let name = self.members[who].name.clone();
        let what = format!("{name} moving {direction:?} from {from:?} to {to:?}");
        self.members[who]
            .bot
            .expect_messages(&for_mover)
            .with_context(|| format!("{what}: the mover"))?;
        self.members[who].at = to;
        for (i, expect) in for_others {
            let observer = &mut self.members[i];
            observer
                .bot
                .expect_messages(&expect)
                .with_context(|| format!("{what}: {} at {:?}", observer.name, observer.at))?;
        }
        Ok(())
    }

    /// Several steps of one member, each checked.
    pub fn walk(&mut self, who: usize, directions: &[Direction]) -> anyhow::Result<()> {
        for &direction in directions {
            self.step(who, direction)?;
        }
        Ok(())
    }

    /// Member `who` chats: it and everyone who sees it hear it, nobody else.
    pub fn chat(&mut self, who: usize, text: &str) -> anyhow::Result<()> {
        let speaker = self.members[who].bot.id();
        let speaker_name = self.members[who].name.clone();
        let at = self.members[who].at;
        self.members[who].bot.send(&msg::chat(text))?;
        let heard = server::chat(speaker, text);
        let mut listeners = vec![who];
        listeners.extend(self.online_others(who));
        for i in listeners {
            let expect = if i == who || self.sees(self.members[i].at, at) {
                vec![heard.clone()]
            } else {
                Vec::new()
            };
            let m = &mut self.members[i];
            m.bot.expect_messages(&expect).with_context(|| {
                format!("{} at {:?} when {speaker_name} said {text:?} at {at:?}", m.name, m.at)
            })?;
        }
        Ok(())
    }

    /// Member `who` logs out: those who see it get `Left`, then its connection closes.
    pub fn logout(&mut self, who: usize) -> anyhow::Result<()> {
        let id = self.members[who].bot.id();
        let at = self.members[who].at;
        self.members[who].bot.send(&msg::logout())?;
        self.members[who].online = false;
        let before_close = self.members[who].bot.expect_closed(deadline(DEFAULT_WAIT))?;
        if !before_close.is_empty() {
            bail!("nothing is owed to a client that logged out, got {before_close:?}");
        }
        for i in self.online_others(who).collect::<Vec<_>>() {
            let expect =
                if self.sees(self.members[i].at, at) { vec![server::left(id)] } else { Vec::new() };
            let m = &mut self.members[i];
            m.bot
                .expect_messages(&expect)
                .with_context(|| format!("{} at {:?} when {id} logged out", m.name, m.at))?;
        }
        Ok(())
    }

    /// Checks [`Scene::expect_settled`], then logs everyone out, one by one, each logout
    /// checked: the scene leaves nobody behind in the world.
    pub fn finish(mut self) -> anyhow::Result<()> {
        self.expect_settled()?;
        for who in 0..self.members.len() {
            if self.members[who].online {
                self.logout(who)?;
            }
        }
        Ok(())
    }

    /// Every online bot gets nothing more, and sees exactly those in sight.
    pub fn expect_settled(&mut self) -> anyhow::Result<()> {
        for i in 0..self.members.len() {
            if !self.members[i].online {
                continue;
            }
            let at = self.members[i].at;
            let want: std::collections::BTreeMap<u64, (u32, u32)> = self
                .online_others(i)
                .filter(|&j| self.sees(self.members[j].at, at))
                .map(|j| (self.members[j].bot.id(), self.members[j].at))
                .collect();
            let m = &mut self.members[i];
            m.bot.expect_quiet()?;
            let got: std::collections::BTreeMap<u64, (u32, u32)> =
                m.bot.view().others().iter().map(|(id, seen)| (*id, seen.position)).collect();
            if got != want {
                return Err(m
                    .bot
                    .report(&format!("at {at:?} it sees {got:?}, it should see {want:?}")));
            }
        }
        Ok(())
    }
}
