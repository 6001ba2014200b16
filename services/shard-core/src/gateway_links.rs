//! The core's gateway links: which relay links are open, each one's gateway and lane, the
//! open link of each lane (a session's output goes on its lane's link), and the links the
//! shell is to end (`Transmit::CloseLink`).
//!
//! Only `ShardCore` calls it; the players on a link are the core's to remove when it goes.

use rustc_hash::FxHashMap;

use crate::types::{GatewayLane, Link, LinkId};

#[derive(Default)]
pub(crate) struct GatewayLinks {
    links: FxHashMap<LinkId, Link>,
    by_lane: FxHashMap<GatewayLane, LinkId>,
    closing: Vec<LinkId>,
}

impl GatewayLinks {
    /// A gateway lane's link opened (the lane's newest link takes its output).
    pub fn opened(&mut self, link: LinkId, gateway: u32, lane: u32) -> GatewayLane {
        self.links.insert(link, Link { gateway, lane });
        let opened = GatewayLane { gateway, lane };
        self.by_lane.insert(opened, link);
        opened
    }

    /// A link is gone; its lane has no link unless a newer one took it over.
    pub fn gone(&mut self, link: LinkId) {
        if let Some(closed) = self.links.remove(&link) {
            // Only this lane's: the gateway's other lanes keep their links.
            let lane = GatewayLane { gateway: closed.gateway, lane: closed.lane };
            if self.by_lane.get(&lane) == Some(&link) {
                self.by_lane.remove(&lane);
            }
        }
    }

    /// The gateway an open link is from.
    pub fn gateway_of(&self, link: LinkId) -> Option<u32> {
        self.links.get(&link).map(|l| l.gateway)
    }

    /// The open link of a gateway lane.
    pub fn of_lane(&self, lane: GatewayLane) -> Option<LinkId> {
        self.by_lane.get(&lane).copied()
    }

    pub fn is_open(&self, link: LinkId) -> bool {
        self.links.contains_key(&link)
    }

    /// The open links, in the map's order.
    pub fn ids(&self) -> Vec<LinkId> {
        self.links.keys().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// The shell is to end `link` at the next flush.
    pub fn close(&mut self, link: LinkId) {
        self.closing.push(link);
    }

    /// The links to end, in the order they were closed.
    pub fn take_closing(&mut self) -> Vec<LinkId> {
        std::mem::take(&mut self.closing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_keeps_its_newest_link_when_an_older_one_goes() {
        let mut links = GatewayLinks::default();
        let lane = links.opened(LinkId(1), 7, 0);
        links.opened(LinkId(2), 7, 0);
        links.opened(LinkId(3), 7, 1);
        assert_eq!(links.of_lane(lane), Some(LinkId(2)));
        links.gone(LinkId(1));
        assert_eq!(links.of_lane(lane), Some(LinkId(2)), "the older link was not the lane's");
        links.gone(LinkId(2));
        assert_eq!(links.of_lane(lane), None);
        assert_eq!(links.of_lane(GatewayLane { gateway: 7, lane: 1 }), Some(LinkId(3)));
        assert_eq!((links.len(), links.gateway_of(LinkId(3))), (1, Some(7)));
        assert!(!links.is_open(LinkId(2)) && links.gateway_of(LinkId(2)).is_none());
    }

    #[test]
    fn closed_links_are_taken_once_in_order() {
        let mut links = GatewayLinks::default();
        links.close(LinkId(4));
        links.close(LinkId(2));
        assert_eq!(links.take_closing(), [LinkId(4), LinkId(2)]);
        assert!(links.take_closing().is_empty());
    }
}
