//! A model of a region's reservation cells for tests (std atomics) and loom models (loom
//! atomics): `slots` slots, `devices` devices.

use std::sync::atomic::Ordering;

use super::reclaim::{Returned, return_holdings};
use super::{Cells, Kind, OpError, Stop, owner_op, slot_bits, word_bytes};
use crate::sync::Atomic64;

pub(crate) struct Model<A> {
    pub(crate) containers: Vec<A>,
    pub(crate) intents: Vec<A>,
    pub(crate) intent_bytes: Vec<A>,
    pub(crate) held: Vec<Vec<A>>,
    pub(crate) slots: u32,
    pub(crate) devices: u32,
    pub(crate) pause: fn(u32) -> bool,
}

impl<A: Atomic64> Model<A> {
    pub(crate) fn new(slots: u32, devices: u32, zero: fn() -> A, pause: fn(u32) -> bool) -> Self {
        let words = |n: u32| (0..n).map(|_| zero()).collect::<Vec<_>>();
        Model {
            containers: words(devices),
            intents: words(slots),
            intent_bytes: words(slots),
            held: (0..slots).map(|_| words(devices)).collect(),
            slots,
            devices,
            pause,
        }
    }
    pub(crate) fn reserved(&self, device: u32) -> u64 {
        word_bytes(self.containers[device as usize].load(Ordering::Acquire))
    }
    pub(crate) fn held_bytes(&self, slot: u32, device: u32) -> u64 {
        word_bytes(self.held[slot as usize][device as usize].load(Ordering::Acquire))
    }
    pub(crate) fn sum_held(&self, device: u32) -> u64 {
        (0..self.slots).map(|s| self.held_bytes(s, device)).sum()
    }
    /// An owner's operation on device 0; `Ok(bytes moved)`.
    pub(crate) fn op(
        &self,
        slot: u32,
        kind: Kind,
        bytes: u64,
        limit: u64,
        stop: Stop,
    ) -> Result<u64, OpError> {
        owner_op(self, slot, 0, kind, bytes, limit, || true, stop).map(|a| a.moved)
    }
    /// A reclaim of a dead owner's slot.
    pub(crate) fn reclaim(&self, slot: u32, stop: Stop) -> Option<Returned> {
        return_holdings(self, slot, true, || true, stop)
    }
}

impl<A: Atomic64> Cells for Model<A> {
    type A = A;
    fn container(&self, device: u32) -> Option<&A> {
        self.containers.get(device as usize)
    }
    fn intent(&self, slot: u32) -> Option<&A> {
        self.intents.get(slot as usize)
    }
    fn intent_bytes(&self, slot: u32) -> Option<&A> {
        self.intent_bytes.get(slot as usize)
    }
    fn held(&self, slot: u32, device: u32) -> Option<&A> {
        self.held.get(slot as usize)?.get(device as usize)
    }
    fn slot_bits(&self) -> u32 {
        slot_bits(self.slots)
    }
    fn device_count(&self) -> u32 {
        self.devices
    }
    fn pause(&self, round: u32) -> bool {
        (self.pause)(round)
    }
}
