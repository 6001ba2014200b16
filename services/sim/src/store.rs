//! The store in the simulation (issue 34, item 4): persistent entities, the game's
//! key-value space and the players' saves, with the real store's fence
//! (`meridian_store::entities`), answering each request after a latency drawn from the
//! seed. A request of a shard killed before it lands is lost or written, as the seed says
//! (a process may die with its write in flight, on either side of the commit); its answer
//! goes nowhere. At quiescence every entity the store holds is owned by exactly one shard,
//! the one whose save it holds, and every persistent entity a shard owns is in the store:
//! never duplicated, never lost across handoffs, deaths and restores.

use std::collections::BTreeMap;
use std::time::Duration;

use meridian_game::{KvAnswer, KvValue};
use meridian_shard_core::kv::{KvOp, KvReply, KvRequest};
use meridian_shard_core::{EntityRecord, EntitySave, Event};
use rand::Rng;

use crate::{Ev, Sim};

/// What a shard asked of the store.
pub(crate) enum Request {
    Players(Vec<u64>),
    /// A round of writes, with its number: a shard's rounds land in order (its writer
    /// takes them one batch after another).
    Save(u64, Vec<EntitySave>),
    /// This shard's regions: what stands in them, and what the shard saved last.
    Load(Vec<[u32; 4]>),
    Claim(Vec<EntityRecord>),
    Kv(Vec<KvRequest>),
    Ids,
}

#[derive(Default)]
pub(crate) struct StoreModel {
    /// Each entity's row, and whether it is a tombstone.
    rows: BTreeMap<u64, (EntityRecord, bool)>,
    kv: BTreeMap<Vec<u8>, KvValue>,
    version: u64,
    /// Requests on their way, by number: the shard that asked, and what.
    pending: BTreeMap<u64, (u32, Request)>,
    next: u64,
    /// The next block of entity ids.
    next_id: u64,
    /// When each shard's last round of writes lands: the next lands after it.
    last_save: BTreeMap<u32, std::time::Duration>,
}

/// Entity ids handed out in blocks of this many, from far above the players'.
const ID_BLOCK: u64 = 1_024;
const FIRST_ENTITY_ID: u64 = 50_000_000;

impl StoreModel {
    pub fn idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// The real store's fence: a write of (generation, shard) lands over no row, an older
    /// generation, or the same generation and shard (an upsert not over that owner's
    /// tombstone).
    fn write(&mut self, record: EntityRecord, removed: bool) -> bool {
        let lands = match self.rows.get(&record.id) {
            None => true,
            Some((row, tombstone)) => {
                row.generation < record.generation
                    || (row.generation == record.generation
                        && row.shard == record.shard
                        && (removed || !tombstone))
            }
        };
        if lands {
            self.rows.insert(record.id, (record, removed));
        }
        lands
    }

    fn save(&mut self, save: EntitySave) -> Option<u64> {
        let id = save.id();
        let landed = match save {
            EntitySave::Upsert(record) => self.write(record, false),
            EntitySave::Remove { id, generation, shard, incarnation } => {
                let tombstone = EntityRecord {
                    id,
                    kind: 0,
                    name: String::new(),
                    at: (0, 0),
                    state: Vec::new(),
                    private: Vec::new(),
                    generation,
                    shard,
                    incarnation,
                };
                self.write(tombstone, true)
            }
        };
        (!landed).then_some(id)
    }

    fn kv(&mut self, request: KvRequest) -> KvReply {
        let current = self.kv.get(&request.key).cloned();
        let answer = match request.op {
            KvOp::Get => KvAnswer::Found(current),
            KvOp::Set { value, expected } => {
                let version_now = current.as_ref().map_or(0, |c| c.version);
                if expected.is_some_and(|e| e != version_now) {
                    KvAnswer::Conflict(current)
                } else {
                    match value {
                        Some(value) => {
                            self.version += 1;
                            let version = self.version;
                            self.kv.insert(request.key.clone(), KvValue { value, version });
                            KvAnswer::Written { version }
                        }
                        None => {
                            self.kv.remove(&request.key);
                            KvAnswer::Written { version: 0 }
                        }
                    }
                }
            }
        };
        KvReply { ticket: request.ticket, key: request.key, answer }
    }

    /// The entities the store holds (no tombstones).
    pub fn entities(&self) -> impl Iterator<Item = &EntityRecord> {
        self.rows.values().filter(|(_, removed)| !removed).map(|(row, _)| row)
    }
}

impl Sim {
    /// A shard's request, answered after the store's latency.
    pub(crate) fn store_ask(&mut self, s: u32, request: Request) {
        let store = &mut self.store;
        store.next += 1;
        let number = store.next;
        let in_order = matches!(request, Request::Save(..));
        store.pending.insert(number, (s, request));
        let latency = Duration::from_micros(self.rng.random_range(500..30_000));
        let mut at = self.t + latency;
        if in_order {
            let after = self.store.last_save.get(&s).copied().unwrap_or_default();
            at = at.max(after + Duration::from_micros(1));
            self.store.last_save.insert(s, at);
        }
        self.at(at, Ev::Store(number));
    }

    /// The store carries a request out and answers it.
    pub(crate) fn store_step(&mut self, number: u64) {
        let Some((s, request)) = self.store.pending.remove(&number) else { return };
        let alive = self.shard_alive(s);
        if !alive && self.rng.random_bool(0.5) {
            return;
        }
        let event = match request {
            Request::Players(players) => Event::Saved { players },
            Request::Save(round, saves) => {
                let refused: Vec<u64> =
                    saves.into_iter().filter_map(|save| self.store.save(save)).collect();
                Event::EntitiesSaved { through: round, refused }
            }
            Request::Load(areas) => {
                let inside = |r: &EntityRecord| {
                    let (x, y) = r.at;
                    r.shard == s
                        || areas.iter().any(|[x0, y0, x1, y1]| {
                            (*x0..*x1).contains(&x) && (*y0..*y1).contains(&y)
                        })
                };
                Event::EntitiesFound(self.store.entities().filter(|r| inside(r)).cloned().collect())
            }
            Request::Claim(claims) => Event::EntitiesClaimed(
                claims.into_iter().filter(|c| self.store.write(c.clone(), false)).collect(),
            ),
            Request::Kv(requests) => {
                Event::KvAnswers(requests.into_iter().map(|r| self.store.kv(r)).collect())
            }
            Request::Ids => {
                let start = FIRST_ENTITY_ID + self.store.next_id;
                self.store.next_id += ID_BLOCK;
                Event::Ids(start..start + ID_BLOCK)
            }
        };
        if !alive {
            return;
        }
        if let Event::EntitiesClaimed(claims) = &event {
            let ids: Vec<u64> = claims.iter().map(|c| c.id).collect();
            self.note(&ids, || format!("shard {s}'s claims of {ids:?} taken"));
        }
        let now = self.now();
        self.hand_shard(s, now, event);
        self.pump_shard(s);
    }

    /// At quiescence: every entity the store holds is owned by exactly one live shard, the
    /// one that saved it last, and every persistent entity a shard owns is in the store.
    pub(crate) fn check_entities(&mut self) {
        let mut owners: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for (&s, node) in &self.shards {
            let Some(core) = &node.core else { continue };
            for (npc, _, persistent) in core.owned_npcs() {
                if persistent {
                    owners.entry(npc.0).or_default().push(s);
                }
            }
        }
        if let Some((id, shards)) = owners.iter().find(|(_, shards)| shards.len() > 1) {
            let what = format!("persistent entity {id} is owned by shards {shards:?}");
            return self.fail(what, vec![*id]);
        }
        let stored: BTreeMap<u64, EntityRecord> =
            self.store.entities().map(|row| (row.id, row.clone())).collect();
        self.outcome.entities = stored.len();
        for (id, row) in &stored {
            match owners.get(id).map(|shards| shards[0]) {
                None => {
                    let what = format!(
                        "persistent entity {id} is in the store (saved by shard {} at generation {}, at {:?}) but no shard owns it",
                        row.shard, row.generation, row.at
                    );
                    return self.fail(what, vec![*id]);
                }
                Some(owner) if owner != row.shard => {
                    let what = format!(
                        "persistent entity {id} is owned by shard {owner}, but the store holds shard {}'s save",
                        row.shard
                    );
                    return self.fail(what, vec![*id]);
                }
                Some(_) => {}
            }
        }
        if let Some((id, shards)) = owners.iter().find(|(id, _)| !stored.contains_key(id)) {
            let what =
                format!("persistent entity {id}, owned by shard {shards:?}, is not in the store");
            self.fail(what, vec![*id]);
        }
    }
}
