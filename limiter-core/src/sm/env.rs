//! What a launch's way through the duty cycle ([`super::window`]) works on: one device's
//! duty-cycle words ([`View`], [`Window`]) and the driver, clock and region around it ([`Env`]).

/// One device's duty-cycle words as a launch reads them (CLOCK_MONOTONIC ns; 0 = never set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Start of the window opened last (the first launch, or one after a gap).
    pub start: u64,
    /// A recent launch.
    pub last: u64,
    /// Launches wait until then; the next window starts then.
    pub resume: u64,
    /// Start of the window closed last.
    pub closed: u64,
}

/// One device's duty-cycle words: the region's (`region::SmShare`, shared by the container's
/// processes) or this process's own. `start` and `resume` only grow.
pub trait Window {
    fn view(&self) -> View;
    /// Opens a window at `now` (raises `start` to `now`, sets `last`).
    fn open(&self, now: u64);
    /// Notes a launch at `now`.
    fn touch(&self, now: u64);
    /// Closes the window that started at `start`: launches wait until at least `resume`.
    fn close(&self, start: u64, resume: u64);
    /// Forgets a window whose words still hold `seen` (times that cannot be believed).
    fn repair(&self, seen: View);
    /// The `(target percent, per mille)` the feedback loop set, if any.
    fn duty(&self) -> Option<(u8, u16)>;
}

impl<W: Window + ?Sized> Window for &W {
    fn view(&self) -> View {
        (**self).view()
    }
    fn open(&self, now: u64) {
        (**self).open(now)
    }
    fn touch(&self, now: u64) {
        (**self).touch(now)
    }
    fn close(&self, start: u64, resume: u64) {
        (**self).close(start, resume)
    }
    fn repair(&self, seen: View) {
        (**self).repair(seen)
    }
    fn duty(&self) -> Option<(u8, u16)> {
        (**self).duty()
    }
}

/// What the controller needs from the driver, the clock and the region (faked in the tests).
pub trait Env {
    type Window: Window;
    /// The device of the calling thread's current context, if any.
    fn device(&self) -> Option<usize>;
    /// The duty-cycle words of `device`.
    fn window(&self, device: usize) -> Option<Self::Window>;
    /// Monotonic nanoseconds (`CLOCK_MONOTONIC`: the same in every process of the host).
    fn now_ns(&self) -> u64;
    /// Waits until the device has finished all work this process launched.
    fn drain(&self);
    /// Blocks the calling thread until `now_ns() >= t`.
    fn sleep_until(&self, t: u64);
    /// Until when a latency-tier neighbour's work holds this best-effort container's launches
    /// on `device` back (CLOCK_MONOTONIC ns; 0: none). Read only while the controller gates the
    /// device ([`super::Controller::set_gate`]).
    fn latency_until(&self, _device: usize) -> u64 {
        0
    }
    /// A launch of this QoS-tiered container on `device` at `now` outside any window (the device
    /// is not limited now): notes that the container launches (and, for the latency tier, that
    /// its work is in flight), as a window's launches do. Called only while the controller marks
    /// the device ([`super::Controller::set_tiered`]).
    fn mark_launch(&self, _device: usize, _now: u64) {}
    /// A launch of this QoS-tiered container on `device`, after the duty cycle let it through:
    /// a latency-tier container whose work in flight has lapsed on the board publishes it at
    /// once. Called only while the controller marks the device ([`super::Controller::set_tiered`]).
    fn tiered_launch(&self, _device: usize) {}
}
