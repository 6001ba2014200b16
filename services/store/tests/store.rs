//! One test suite, run against both stores: an SQLite file in a temporary directory, and a
//! real PostgreSQL server of the test's own (`initdb` in a temporary directory).

use std::path::PathBuf;

use meridian_store::{
    Address, Area, EntityReport, EntityRow, EntityWrite, KvEntry, KvWrite, Save, Saved, Store,
    StoreError, ENTITY_NAME_MAX, ENTITY_STATE_MAX, KV_KEY_MAX, KV_VALUE_MAX, MAX_AREAS, MAX_BATCH,
};
use meridian_testkit::TempPostgres;

/// Where a test's store lives; kept alive for as long as the test uses it.
enum Backend {
    Sqlite(PathBuf),
    Postgres(TempPostgres),
}

impl Backend {
    fn sqlite(test: &str) -> Backend {
        let dir =
            std::env::temp_dir().join(format!("meridian-store-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Backend::Sqlite(dir.join("players.db"))
    }

    fn postgres() -> Backend {
        Backend::Postgres(TempPostgres::start().expect("a PostgreSQL server of the test's own"))
    }

    fn address(&self) -> Address {
        match self {
            Backend::Sqlite(path) => Address::Sqlite(path.clone()),
            Backend::Postgres(pg) => Address::parse(&pg.url()).expect("a postgres:// address"),
        }
    }

    async fn open(&self) -> Store {
        Store::open(&self.address()).await.expect("the store opens")
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Backend::Sqlite(path) = self {
            if let Some(dir) = path.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

fn save(player_id: u64, generation: u64, at: (u32, u32), state: &[u8]) -> Save {
    Save { player_id, generation, at, state: state.to_vec() }
}

/// An account keeps its player: same id and state on every login; a new account gets the
/// id offered; an id that belongs to another account is refused as taken.
async fn an_account_keeps_its_player(backend: Backend) {
    let store = backend.open().await;
    let alice = store.player("alice", "Alice", 101).await.unwrap();
    assert_eq!((alice.player_id, alice.name.as_str(), alice.saved.as_ref()), (101, "Alice", None));
    let again = store.player("alice", "Alice the Second", 999).await.unwrap();
    assert_eq!(again.player_id, 101, "the account's id, not the one offered");
    assert_eq!(again.name, "Alice the Second", "the token's display name wins");
    match store.player("bob", "Bob", 101).await {
        Err(StoreError::IdTaken(101)) => {}
        other => panic!("expected IdTaken(101), got {other:?}"),
    }
    let bob = store.player("bob", "Bob", 102).await.unwrap();
    assert_eq!(bob.player_id, 102);
    assert_eq!(store.load(102).await.unwrap().map(|p| p.account), Some("bob".to_string()));
    assert_eq!(store.load(7).await.unwrap(), None);
}

/// What is saved is what a later login finds, across closing and opening the store again.
async fn saves_survive_reopening(backend: Backend) {
    let store = backend.open().await;
    store.player("alice", "Alice", 1).await.unwrap();
    store.player("bob", "Bob", 2).await.unwrap();
    let report =
        store.save(&[save(1, 3, (10, 20), b"hp=7"), save(2, 1, (300, 301), b"")]).await.unwrap();
    assert_eq!((report.written, report.refused.len()), (2, 0));
    drop(store);
    let store = backend.open().await;
    let alice = store.player("alice", "Alice", 77).await.unwrap();
    let expected = Saved { at: (10, 20), state: b"hp=7".to_vec(), generation: 3 };
    assert_eq!(alice.saved, Some(expected));
    assert_eq!(store.load(2).await.unwrap().unwrap().saved.unwrap().at, (300, 301));
}

/// A save from an older owner (a lower generation) never overwrites a newer one; the same
/// generation saving again does; an unknown player is refused, not created.
async fn saves_are_fenced_by_generation(backend: Backend) {
    let store = backend.open().await;
    store.player("alice", "Alice", 1).await.unwrap();
    store.save(&[save(1, 5, (50, 50), b"new owner")]).await.unwrap();
    let late = store.save(&[save(1, 4, (40, 40), b"old owner, woke up late")]).await.unwrap();
    assert_eq!((late.written, late.refused.clone()), (0, vec![1]));
    let again = store.save(&[save(1, 5, (51, 50), b"new owner again")]).await.unwrap();
    assert_eq!(again.written, 1);
    let unknown = store.save(&[save(404, 1, (1, 1), b"")]).await.unwrap();
    assert_eq!((unknown.written, unknown.refused), (0, vec![404]));
    let saved = store.load(1).await.unwrap().unwrap().saved.unwrap();
    assert_eq!(
        (saved.at, saved.generation, saved.state),
        ((51, 50), 5, b"new owner again".to_vec())
    );
}

/// A batch bigger than one statement takes is split and written whole; the last save of a
/// player named twice in a batch is the one kept.
async fn a_big_batch_is_written_whole(backend: Backend) {
    let store = backend.open().await;
    let n = MAX_BATCH as u64 * 2 + 17;
    for id in 1..=n {
        store.player(&format!("account-{id}"), "p", id).await.unwrap();
    }
    let mut batch: Vec<Save> = (1..=n).map(|id| save(id, 1, (id as u32 % 400, 7), b"s")).collect();
    batch.push(save(1, 2, (9, 9), b"last"));
    let report = store.save(&batch).await.unwrap();
    assert_eq!((report.written as u64, report.refused.len()), (n, 0));
    let first = store.load(1).await.unwrap().unwrap().saved.unwrap();
    assert_eq!((first.at, first.generation), ((9, 9), 2));
    let last = store.load(n).await.unwrap().unwrap().saved.unwrap();
    assert_eq!(last.at, (n as u32 % 400, 7));
}

/// An operator's lookup by account creates nothing; an operator's move sets the cell a
/// player comes back at, keeping its generation, so the player's own next save wins.
async fn an_operator_finds_and_places_players(backend: Backend) {
    let store = backend.open().await;
    assert_eq!(store.find("alice").await.unwrap(), None, "no such account yet");
    assert_eq!(store.load(1).await.unwrap(), None, "and the lookup made none");
    store.player("alice", "Alice", 1).await.unwrap();
    store.save(&[save(1, 3, (10, 20), b"")]).await.unwrap();
    assert_eq!(store.find("alice").await.unwrap().map(|p| p.player_id), Some(1));
    assert!(store.place(1, (200, 210)).await.unwrap(), "alice exists");
    assert!(!store.place(2, (1, 1)).await.unwrap(), "player 2 does not");
    let saved = store.find("alice").await.unwrap().unwrap().saved.unwrap();
    assert_eq!((saved.at, saved.generation), ((200, 210), 3));
    store.save(&[save(1, 3, (11, 20), b"")]).await.unwrap();
    assert_eq!(store.load(1).await.unwrap().unwrap().saved.unwrap().at, (11, 20));
}

/// Many lookups at once (a gateway runs 16, a PostgreSQL store spreads them over its
/// connections): each account gets its own player, and a second round finds the same ones.
async fn concurrent_lookups_each_get_their_own_player(backend: Backend) {
    let store = std::sync::Arc::new(backend.open().await);
    let lookup = |n: u64| {
        let store = std::sync::Arc::clone(&store);
        tokio::spawn(async move { store.player(&format!("a{n}"), "n", 1_000 + n).await })
    };
    let first: Vec<_> = (0..40).map(lookup).collect();
    let mut ids = Vec::new();
    for task in first {
        ids.push(task.await.expect("joins").expect("a player").player_id);
    }
    assert_eq!(ids, (1_000..1_040).collect::<Vec<u64>>(), "each account its own offered id");
    let again: Vec<_> = (0..40)
        .map(|n| {
            let store = std::sync::Arc::clone(&store);
            tokio::spawn(async move { store.player(&format!("a{n}"), "n", 9_000 + n).await })
        })
        .collect();
    for (n, task) in again.into_iter().enumerate() {
        let player = task.await.expect("joins").expect("a player");
        assert_eq!(player.player_id, 1_000 + n as u64, "a{n} keeps its player");
    }
}

/// Logins racing in one moment (and so, on SQLite, in one transaction): the one that offers
/// an id another account has is refused `IdTaken`, and only it; the others' players are
/// created and are there after the store is opened again.
async fn a_taken_id_refuses_only_its_own_login(backend: Backend) {
    let store = std::sync::Arc::new(backend.open().await);
    store.player("owner", "o", 5_000).await.expect("the owner's player");
    let tasks: Vec<_> = (0..20u64)
        .map(|n| {
            let store = std::sync::Arc::clone(&store);
            let (account, id) =
                if n == 7 { ("intruder".to_string(), 5_000) } else { (format!("b{n}"), 6_000 + n) };
            tokio::spawn(async move { (n, store.player(&account, "n", id).await) })
        })
        .collect();
    for task in tasks {
        let (n, result) = task.await.expect("joins");
        match result {
            Err(StoreError::IdTaken(5_000)) if n == 7 => {}
            Ok(player) if n != 7 => assert_eq!(player.player_id, 6_000 + n),
            other => panic!("login {n}: {other:?}"),
        }
    }
    drop(store);
    let store = backend.open().await;
    for n in (0..20u64).filter(|n| *n != 7) {
        let found = store.find(&format!("b{n}")).await.expect("a lookup");
        assert_eq!(found.map(|p| p.player_id), Some(6_000 + n), "b{n} was committed");
    }
    assert_eq!(store.find("intruder").await.expect("a lookup"), None);
}

/// While another process holds SQLite's write lock, logins queue behind the one transaction
/// waiting for it, and are then committed together: 64 logins, 2 transactions (one login
/// per transaction queued 64 syncs one behind another, and under load the last of them
/// waited past the 5 s busy timeout: "database is locked").
#[tokio::test]
async fn a_burst_of_logins_commits_in_one_transaction() {
    let backend = Backend::sqlite("burst");
    let store = std::sync::Arc::new(backend.open().await);
    let Backend::Sqlite(path) = &backend else { unreachable!() };
    let Store::Sqlite(sqlite) = &*store else { panic!("an SQLite store") };
    // Another process's write transaction.
    let holder = rusqlite::Connection::open(path).expect("a second connection");
    holder.execute_batch("BEGIN IMMEDIATE").expect("the write lock");
    let login = |n: u64| {
        let store = std::sync::Arc::clone(&store);
        tokio::spawn(async move { store.player(&format!("c{n}"), "n", 7_000 + n).await })
    };
    // The first login's transaction takes it and waits for the lock...
    let mut tasks = vec![login(0)];
    wait_until("the first login is being committed", || sqlite.logins_queued() == (0, 1)).await;
    // ... and the next 63 wait for that one.
    tasks.extend((1..64).map(login));
    wait_until("63 logins wait", || sqlite.logins_queued() == (63, 1)).await;
    holder.execute_batch("COMMIT").expect("the lock released");
    for (n, task) in tasks.into_iter().enumerate() {
        let player = task.await.expect("joins").expect("a player");
        assert_eq!(player.player_id, 7_000 + n as u64);
    }
    assert_eq!(sqlite.login_transactions(), 2, "the first login's, then the other 63's");
}

/// Waits until `done`, bounded well inside the 5 s a waiting SQLite transaction gives the
/// holder of the write lock.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// `meridian up` starts its shards and gateways at once, each opening the one SQLite file:
/// every one of them opens it (the race to set the file up is retried, not failed).
#[tokio::test]
async fn processes_opening_one_sqlite_file_together_all_open_it() {
    let backend = Backend::sqlite("open-together");
    let address = backend.address();
    for round in 0..5 {
        let opening: Vec<_> = (0..8)
            .map(|_| {
                let address = address.clone();
                // Own threads and runtimes, as separate processes would be.
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a runtime");
                    runtime.block_on(Store::open(&address)).map(|_| ())
                })
            })
            .collect();
        for opened in opening {
            let result = opened.join().expect("the thread ends");
            assert!(result.is_ok(), "round {round}: {result:?}");
        }
        if let Backend::Sqlite(path) = &backend {
            let _ = std::fs::remove_dir_all(path.parent().expect("a dir"));
        }
    }
}

/// The game's key-value space: a write expecting a version happens only if the entry is
/// still at it (0: absent), a version is never reused (not after a delete either), and
/// keys and values over their bounds are refused.
async fn game_entries_are_compared_and_set_by_version(backend: Backend) {
    let store = backend.open().await;
    let done = |write: KvWrite| match write {
        KvWrite::Done { version } => version,
        conflict => panic!("expected a write, got {conflict:?}"),
    };
    assert_eq!(store.kv_get(b"guild/7").await.unwrap(), None);
    let v1 = done(store.kv_set(b"guild/7", Some(0), Some(b"ann")).await.unwrap());
    assert!(v1 > 0);
    let entry = |value: &[u8], version| Some(KvEntry { value: value.to_vec(), version });
    assert_eq!(store.kv_get(b"guild/7").await.unwrap(), entry(b"ann", v1));
    let taken = store.kv_set(b"guild/7", Some(0), Some(b"bob")).await.unwrap();
    assert_eq!(taken, KvWrite::Conflict { current: entry(b"ann", v1) }, "created already");
    let v2 = done(store.kv_set(b"guild/7", Some(v1), Some(b"ann,bob")).await.unwrap());
    assert!(v2 > v1);
    let stale = store.kv_set(b"guild/7", Some(v1), Some(b"ann,cy")).await.unwrap();
    assert_eq!(stale, KvWrite::Conflict { current: entry(b"ann,bob", v2) }, "read before");
    let absent = store.kv_set(b"guild/7", Some(0), None).await.unwrap();
    assert_eq!(absent, KvWrite::Conflict { current: entry(b"ann,bob", v2) }, "it is there");
    let v3 = done(store.kv_set(b"guild/7", None, Some(b"cy")).await.unwrap());
    assert!(v3 > v2, "an unconditional write wins");
    assert_eq!(done(store.kv_set(b"guild/7", Some(v3), None).await.unwrap()), 0, "deleted");
    assert_eq!(store.kv_get(b"guild/7").await.unwrap(), None);
    assert_eq!(done(store.kv_set(b"guild/7", None, None).await.unwrap()), 0, "nothing to delete");
    let v4 = done(store.kv_set(b"guild/7", Some(0), Some(b"dee")).await.unwrap());
    assert!(v4 > v3, "a re-created entry gets a version never used: no ABA");
    let too_long = vec![b'k'; KV_KEY_MAX + 1];
    assert!(matches!(store.kv_get(&too_long).await, Err(StoreError::TooBig(_))));
    assert!(matches!(store.kv_get(b"").await, Err(StoreError::TooBig(_))));
    let too_big = vec![0u8; KV_VALUE_MAX + 1];
    let refused = store.kv_set(b"guild/7", None, Some(&too_big)).await;
    assert!(matches!(refused, Err(StoreError::TooBig(_))), "{refused:?}");
    let biggest = vec![7u8; KV_VALUE_MAX];
    let v5 = done(store.kv_set(&[b'k'; KV_KEY_MAX], None, Some(&biggest)).await.unwrap());
    drop(store);
    let store = backend.open().await;
    assert_eq!(store.kv_get(b"guild/7").await.unwrap(), entry(b"dee", v4), "it is durable");
    assert_eq!(store.kv_get(&[b'k'; KV_KEY_MAX]).await.unwrap(), entry(&biggest, v5));
}

/// Writers racing on one key (shards updating one counter): each reads, adds one and
/// writes expecting what it read, reading again on a conflict. No increment is lost.
async fn racing_compare_and_set_loses_no_update(backend: Backend) {
    let store = std::sync::Arc::new(backend.open().await);
    const WRITERS: u64 = 8;
    const EACH: u64 = 10;
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let store = std::sync::Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0;
            for _ in 0..EACH {
                loop {
                    let current = store.kv_get(b"count").await.unwrap();
                    let (n, version) = current.map_or((0, 0), |e| {
                        (u64::from_le_bytes(e.value.try_into().unwrap()), e.version)
                    });
                    let next = (n + 1).to_le_bytes();
                    match store.kv_set(b"count", Some(version), Some(&next)).await.unwrap() {
                        KvWrite::Done { .. } => break,
                        KvWrite::Conflict { .. } => conflicts += 1,
                    }
                }
            }
            conflicts
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total = store.kv_get(b"count").await.unwrap().expect("written");
    assert_eq!(u64::from_le_bytes(total.value.try_into().unwrap()), WRITERS * EACH);
}

/// An entity as a shard of id `shard` at `generation` writes it; its data says which write
/// it was.
fn entity(id: u64, generation: u64, shard: u32) -> EntityRow {
    EntityRow {
        id,
        kind: 3,
        name: format!("chest {id}"),
        at: (id as u32 % 400, 9),
        state: format!("open by {shard} at {generation}").into_bytes(),
        private: format!("loot of {shard} at {generation}").into_bytes(),
        generation,
        shard,
        incarnation: u64::from(shard) * 1_000 + generation,
    }
}

fn upsert(row: &EntityRow) -> EntityWrite {
    EntityWrite::Upsert(row.clone())
}

fn report(written: &[u64], refused: &[u64]) -> EntityReport {
    EntityReport { written: written.to_vec(), refused: refused.to_vec() }
}

/// What is written is what is read back, every field of it (the largest values of each
/// included), in id order, across closing and opening the store again.
async fn entities_survive_reopening(backend: Backend) {
    let store = backend.open().await;
    assert_eq!(store.entities().await.unwrap(), vec![], "no entities yet");
    let edge = EntityRow {
        id: i64::MAX as u64,
        kind: u32::MAX,
        name: "ü".repeat(ENTITY_NAME_MAX / 2),
        at: (u32::MAX, u32::MAX - 1),
        state: vec![0xff; ENTITY_STATE_MAX],
        private: vec![0; ENTITY_STATE_MAX],
        generation: i64::MAX as u64,
        shard: u32::MAX,
        incarnation: i64::MAX as u64,
    };
    let empty =
        EntityRow { name: String::new(), state: vec![], private: vec![], ..entity(1, 0, 0) };
    let writes = [upsert(&entity(20, 2, 7)), upsert(&edge), upsert(&empty)];
    let written = store.save_entities(&writes).await.unwrap();
    assert_eq!(written, report(&[20, edge.id, 1], &[]));
    let expected = vec![empty.clone(), entity(20, 2, 7), edge.clone()];
    assert_eq!(store.entities().await.unwrap(), expected, "in id order");
    drop(store);
    let store = backend.open().await;
    assert_eq!(store.entities().await.unwrap(), expected, "they are durable");
}

/// A write from an older generation is refused; the same generation is accepted from the
/// shard that wrote the row and refused from any other; a newer generation is accepted
/// from any shard.
async fn entity_writes_are_fenced_by_generation_and_shard(backend: Backend) {
    let store = backend.open().await;
    let row = entity(1, 5, 10);
    assert_eq!(store.save_entities(&[upsert(&row)]).await.unwrap(), report(&[1], &[]));
    let older = store.save_entities(&[upsert(&entity(1, 4, 10))]).await.unwrap();
    assert_eq!(older, report(&[], &[1]), "an older generation, even from the same shard");
    let other_shard = store.save_entities(&[upsert(&entity(1, 5, 11))]).await.unwrap();
    assert_eq!(other_shard, report(&[], &[1]), "the same generation from another shard");
    assert_eq!(store.entities().await.unwrap(), vec![row], "refused writes changed nothing");
    let again = EntityRow { at: (2, 3), ..entity(1, 5, 10) };
    let same = store.save_entities(&[upsert(&again)]).await.unwrap();
    assert_eq!(same, report(&[1], &[]), "the owner writing again");
    assert_eq!(store.entities().await.unwrap(), vec![again]);
    let newer = store.save_entities(&[upsert(&entity(1, 6, 11))]).await.unwrap();
    assert_eq!(newer, report(&[1], &[]), "a newer generation, from another shard");
    let late = store.save_entities(&[upsert(&entity(1, 5, 10))]).await.unwrap();
    assert_eq!(late, report(&[], &[1]), "the old owner is fenced out now");
    assert_eq!(store.entities().await.unwrap(), vec![entity(1, 6, 11)]);
}

/// A remove leaves a tombstone: the entity is gone from `entities()`, and an upsert at the
/// tombstone's generation or older (a late write of an old owner, or of the remover itself)
/// cannot bring it back. A remove is fenced like an upsert. An upsert at a newer generation
/// re-creates the entity.
async fn a_removed_entity_leaves_a_tombstone(backend: Backend) {
    let store = backend.open().await;
    store.save_entities(&[upsert(&entity(1, 5, 10)), upsert(&entity(2, 5, 10))]).await.unwrap();
    let stale = EntityWrite::Remove { id: 1, generation: 5, shard: 11, incarnation: 1 };
    assert_eq!(store.save_entities(&[stale]).await.unwrap(), report(&[], &[1]), "not its owner");
    let remove = EntityWrite::Remove { id: 1, generation: 6, shard: 11, incarnation: 1 };
    assert_eq!(
        store.save_entities(std::slice::from_ref(&remove)).await.unwrap(),
        report(&[1], &[])
    );
    assert_eq!(store.entities().await.unwrap(), vec![entity(2, 5, 10)], "1 is hidden");
    for (generation, shard) in [(5, 10), (6, 10), (6, 11)] {
        let late = store.save_entities(&[upsert(&entity(1, generation, shard))]).await.unwrap();
        assert_eq!(late, report(&[], &[1]), "generation {generation}, shard {shard}");
    }
    assert_eq!(store.save_entities(&[remove]).await.unwrap(), report(&[1], &[]), "idempotent");
    let never = EntityWrite::Remove { id: 3, generation: 2, shard: 10, incarnation: 1 };
    assert_eq!(store.save_entities(&[never]).await.unwrap(), report(&[3], &[]));
    let before_it = store.save_entities(&[upsert(&entity(3, 1, 10))]).await.unwrap();
    assert_eq!(before_it, report(&[], &[3]), "a remove of an unknown id fences it too");
    assert_eq!(store.entities().await.unwrap(), vec![entity(2, 5, 10)]);
    let recreated = store.save_entities(&[upsert(&entity(1, 7, 12))]).await.unwrap();
    assert_eq!(recreated, report(&[1], &[]), "a newer owner re-creates it");
    assert_eq!(store.entities().await.unwrap(), vec![entity(1, 7, 12), entity(2, 5, 10)]);
    drop(store);
    let store = backend.open().await;
    let after = store.save_entities(&[upsert(&entity(3, 2, 10))]).await.unwrap();
    assert_eq!(after, report(&[], &[3]), "the tombstone is durable");
}

/// A batch naming an entity twice keeps its last write of it; the report names each id
/// once, at its first place in the batch, written and refused alike.
async fn an_entity_batch_keeps_each_entitys_last_write(backend: Backend) {
    let store = backend.open().await;
    store.save_entities(&[upsert(&entity(9, 5, 1))]).await.unwrap();
    let batch = [
        upsert(&entity(4, 1, 1)),
        upsert(&entity(9, 4, 1)),
        upsert(&entity(2, 1, 1)),
        upsert(&entity(4, 2, 1)),
        EntityWrite::Remove { id: 2, generation: 1, shard: 1, incarnation: 1 },
        upsert(&entity(4, 3, 2)),
        upsert(&entity(7, 1, 1)),
    ];
    let written = store.save_entities(&batch).await.unwrap();
    assert_eq!(written, report(&[4, 2, 7], &[9]));
    let expected = vec![entity(4, 3, 2), entity(7, 1, 1), entity(9, 5, 1)];
    assert_eq!(store.entities().await.unwrap(), expected, "2 removed, 4 its last write");
    assert_eq!(store.save_entities(&[]).await.unwrap(), report(&[], &[]));
}

/// A name, public or private state over its bound fails the whole batch with `TooBig`
/// before the store is asked: nothing of the batch is written.
async fn entities_over_their_bounds_are_refused(backend: Backend) {
    let store = backend.open().await;
    let long_name = EntityRow { name: "n".repeat(ENTITY_NAME_MAX + 1), ..entity(2, 1, 1) };
    let big_state = EntityRow { state: vec![1; ENTITY_STATE_MAX + 1], ..entity(2, 1, 1) };
    let big_private = EntityRow { private: vec![1; ENTITY_STATE_MAX + 1], ..entity(2, 1, 1) };
    let nul_name = EntityRow { name: "a\0b".into(), ..entity(2, 1, 1) };
    for bad in [long_name, big_state, big_private, nul_name] {
        let refused = store.save_entities(&[upsert(&entity(1, 1, 1)), upsert(&bad)]).await;
        assert!(matches!(refused, Err(StoreError::TooBig(_))), "{bad:?}: {refused:?}");
    }
    assert_eq!(store.entities().await.unwrap(), vec![], "not even the good entity");
}

/// Shards loading one entity at once each claim it, upserting the row they loaded with its
/// generation + 1 and their own shard id: exactly one claim is written, every time, and the
/// row is the winner's. Each shard has a store of its own, as separate processes would.
async fn one_of_racing_claims_wins(backend: Backend) {
    const SHARDS: u32 = 8;
    const ROUNDS: u64 = 5;
    let mut stores = Vec::new();
    for _ in 0..SHARDS {
        stores.push(std::sync::Arc::new(backend.open().await));
    }
    stores[0].save_entities(&[upsert(&entity(1, 1, 0))]).await.unwrap();
    for round in 0..ROUNDS {
        let loaded = stores[0].entities().await.unwrap().pop().expect("the entity");
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(SHARDS as usize));
        let claims: Vec<_> = (0..SHARDS)
            .map(|shard| {
                let (store, start) =
                    (std::sync::Arc::clone(&stores[shard as usize]), start.clone());
                let claim = EntityRow {
                    generation: loaded.generation + 1,
                    shard: 100 + shard,
                    ..loaded.clone()
                };
                tokio::spawn(async move {
                    start.wait().await;
                    (shard, store.save_entities(&[EntityWrite::Upsert(claim)]).await)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for claim in claims {
            let (shard, result) = claim.await.expect("joins");
            match result.expect("a report") {
                won if won == report(&[1], &[]) => winners.push(100 + shard),
                lost => assert_eq!(lost, report(&[], &[1]), "round {round}, shard {shard}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one claim wins: {winners:?}");
        let owner = stores[0].entities().await.unwrap().pop().expect("the entity");
        assert_eq!((owner.generation, owner.shard), (loaded.generation + 1, winners[0]));
    }
}

/// A shard loads what stands in its areas (half-open rectangles) and what it saved last
/// wherever it stands, not the whole world; removed entities never.
async fn a_shard_loads_the_entities_of_its_areas_and_its_own(backend: Backend) {
    let store = backend.open().await;
    let at = |id: u64, x: u32, y: u32, shard: u32| EntityRow { at: (x, y), ..entity(id, 1, shard) };
    let rows = [
        at(1, 10, 10, 5),   // in the first area
        at(2, 99, 50, 5),   // on its last column
        at(3, 100, 50, 5),  // just past it
        at(4, 300, 300, 7), // elsewhere, but saved by the loading shard
        at(5, 250, 20, 5),  // in the second area
        at(6, 20, 20, 5),   // in the first area, removed
    ];
    let writes: Vec<EntityWrite> = rows.iter().map(upsert).collect();
    store.save_entities(&writes).await.unwrap();
    let remove = EntityWrite::Remove { id: 6, generation: 2, shard: 5, incarnation: 1 };
    store.save_entities(&[remove]).await.unwrap();
    let areas =
        [Area { x0: 0, y0: 0, x1: 100, y1: 100 }, Area { x0: 200, y0: 0, x1: 400, y1: 100 }];
    let loaded: Vec<u64> =
        store.entities_for(&areas, 7).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(loaded, [1, 2, 4, 5]);
    let none: Vec<u64> =
        store.entities_for(&[], 9).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(none, Vec::<u64>::new(), "no area and nothing of its own");
    let too_many = vec![areas[0]; MAX_AREAS + 1];
    assert!(matches!(store.entities_for(&too_many, 7).await, Err(StoreError::TooBig(_))));
}

macro_rules! suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $test() {
                super::$test(super::Backend::sqlite(stringify!($test))).await
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $test() {
                super::$test(super::Backend::postgres()).await
            })*
        }
    };
}

suite! {
    an_account_keeps_its_player,
    saves_survive_reopening,
    saves_are_fenced_by_generation,
    a_big_batch_is_written_whole,
    an_operator_finds_and_places_players,
    concurrent_lookups_each_get_their_own_player,
    a_taken_id_refuses_only_its_own_login,
    game_entries_are_compared_and_set_by_version,
    racing_compare_and_set_loses_no_update,
    entities_survive_reopening,
    a_shard_loads_the_entities_of_its_areas_and_its_own,
    entity_writes_are_fenced_by_generation_and_shard,
    a_removed_entity_leaves_a_tombstone,
    an_entity_batch_keeps_each_entitys_last_write,
    entities_over_their_bounds_are_refused,
    one_of_racing_claims_wins,
}

/// A PostgreSQL store that stops answering reports `Unavailable`, and works again once the
/// server is back, without being opened again.
#[tokio::test]
async fn postgres_comes_back_after_an_outage() {
    let mut pg = TempPostgres::start().expect("a PostgreSQL server");
    let store = Store::open(&Address::parse(&pg.url()).unwrap()).await.unwrap();
    store.player("alice", "Alice", 1).await.unwrap();
    pg.stop().unwrap();
    match store.save(&[save(1, 1, (2, 2), b"")]).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable while the server is down, got {other:?}"),
    }
    pg.restart().unwrap();
    let report = store.save(&[save(1, 1, (2, 2), b"")]).await.unwrap();
    assert_eq!(report.written, 1);
}
