//! The worker's endpoints, client connections and relay links alike, in one slab: an
//! endpoint keeps its index for its life, and the index's generation tells it from an
//! earlier endpoint in the same place (late completions, late shard output). Owned by
//! [`super::Core`]; only the core's rooms use it.

use std::sync::Arc;

use super::{Conn, Endpoint, Uplink};
use crate::routing::ShardLink;

pub(super) enum Entry {
    Client(Box<Conn>),
    Link(Box<Uplink>),
}

#[derive(Default)]
pub(super) struct Endpoints {
    entries: Vec<Option<Entry>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    /// The indices of the relay links, in the order they opened.
    links: Vec<u32>,
    /// Client connections open.
    pub(super) clients: usize,
}

impl Endpoints {
    pub(super) fn insert(&mut self, mut entry: Entry) -> Endpoint {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.entries.push(None);
                self.generations.push(0);
                (self.entries.len() - 1) as u32
            }
        };
        let generation = self.generations[index as usize];
        match &mut entry {
            Entry::Client(conn) => {
                conn.generation_slot = generation;
                self.clients += 1;
            }
            Entry::Link(_) => self.links.push(index),
        }
        self.entries[index as usize] = Some(entry);
        Endpoint::new(index, generation)
    }

    /// Frees an index; its generation moves on.
    pub(super) fn remove(&mut self, index: u32) -> Option<Entry> {
        let entry = self.entries.get_mut(index as usize)?.take()?;
        let generation = &mut self.generations[index as usize];
        *generation = (*generation + 1) & 0x00ff_ffff;
        self.free.push(index);
        match &entry {
            Entry::Client(_) => self.clients -= 1,
            Entry::Link(_) => self.links.retain(|&l| l != index),
        }
        Some(entry)
    }

    /// Indices in use or not: an index past them is never an endpoint.
    pub(super) fn len(&self) -> u32 {
        self.entries.len() as u32
    }

    pub(super) fn get(&self, endpoint: Endpoint) -> Option<&Entry> {
        let current = self.generations.get(endpoint.index as usize) == Some(&endpoint.generation);
        self.entries.get(endpoint.index as usize)?.as_ref().filter(|_| current)
    }

    pub(super) fn get_mut(&mut self, endpoint: Endpoint) -> Option<&mut Entry> {
        let current = self.generations.get(endpoint.index as usize) == Some(&endpoint.generation);
        self.entries.get_mut(endpoint.index as usize)?.as_mut().filter(|_| current)
    }

    /// The client connection at `index`, whatever its generation.
    pub(super) fn conn_mut(&mut self, index: u32) -> Option<&mut Conn> {
        match self.entries.get_mut(index as usize)? {
            Some(Entry::Client(conn)) => Some(conn),
            _ => None,
        }
    }

    pub(super) fn conns(&self) -> impl Iterator<Item = (u32, &Conn)> + '_ {
        self.entries.iter().enumerate().filter_map(|(index, entry)| match entry {
            Some(Entry::Client(conn)) => Some((index as u32, &**conn)),
            _ => None,
        })
    }

    pub(super) fn link_mut(&mut self, index: u32) -> Option<&mut Uplink> {
        match self.entries.get_mut(index as usize)? {
            Some(Entry::Link(uplink)) => Some(uplink),
            _ => None,
        }
    }

    /// The relay links' indices, in the order they opened.
    pub(super) fn link_indices(&self) -> Vec<u32> {
        self.links.clone()
    }

    /// How many links there are; the `i`th is at [`Endpoints::link_at`].
    pub(super) fn link_count(&self) -> usize {
        self.links.len()
    }

    pub(super) fn link_at(&mut self, i: usize) -> Option<(u32, &mut Uplink)> {
        let index = *self.links.get(i)?;
        self.link_mut(index).map(|uplink| (index, uplink))
    }

    /// The live (not failed) link to `link`'s shard, if connected.
    pub(super) fn find_link(&self, link: &Arc<ShardLink>) -> Option<u32> {
        self.links.iter().copied().find(|&index| {
            matches!(&self.entries[index as usize],
                Some(Entry::Link(uplink)) if !uplink.failed && Arc::ptr_eq(&uplink.link, link))
        })
    }

    /// Links sealed and ready for the event loop (see `Uplink::ready`), taken.
    pub(super) fn dirty_links(&mut self, into: &mut Vec<Endpoint>) {
        for &index in &self.links {
            if let Some(Entry::Link(uplink)) = &mut self.entries[index as usize] {
                if std::mem::take(&mut uplink.ready) {
                    into.push(Endpoint::new(index, self.generations[index as usize]));
                }
            }
        }
    }

    /// The endpoint at `index`, if one is there.
    #[cfg(test)]
    pub(super) fn endpoint_at(&self, index: u32) -> Option<Endpoint> {
        let present = self.entries.get(index as usize)?.is_some();
        present.then(|| Endpoint::new(index, self.generations[index as usize]))
    }
}
