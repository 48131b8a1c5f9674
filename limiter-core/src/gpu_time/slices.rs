//! Other contexts' time slices inside a sampled pair.
//!
//! Without MPS a GPU runs one context at a time and, while several have work, switches between
//! them in time slices. A pair of events around one launch then times the launch and any slice
//! of another context that fell between its two events: how long the launch's context waited for
//! it, not how long the GPU worked on it. For a kernel much shorter than a slice few samples are
//! hit, but each by a whole slice; beside a saturating neighbour on an H200 that read a
//! container's GPU time as about twice what it got (`scripts/gpu/validate-sm-work.sh`).
//!
//! So each sample counts at most the sixth-longest of the last [`HISTORY`] (16) samples of the
//! same *launch shape* on the thread (one kernel with one grid, block and shared memory size, or
//! one graph), once [`MIN_HISTORY`] are known: a sample hit by a slice counts what that launch
//! usually takes, and one that is not hit counts as measured. It holds while at most 5 of a
//! shape's last 16 samples are hit, which is the case for launches much shorter than a slice.
//! What it cannot tell apart: a launch as long as a slice or longer (every sample is hit), and
//! launches of one shape that do different amounts of work (a persistent kernel whose grid is
//! the SM count, say), whose five longest of 16 count only as much as the sixth.
//!
//! The table is direct-mapped and fixed in size ([`SHAPES`] entries a thread): a shape that
//! lands on an entry held by another starts its history again.

/// Samples kept per launch shape.
pub const HISTORY: usize = 16;
/// Samples of a shape before its percentile caps a sample.
pub const MIN_HISTORY: usize = 8;
/// Launch shapes tracked per thread.
pub const SHAPES: usize = 64;

/// A launch shape: a kernel with its grid, block and shared memory size, or a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape(u64);

impl Shape {
    /// The shape of a kernel launch (the function handle, grid, block and dynamic shared memory).
    pub fn kernel(function: u64, grid: [u32; 3], block: [u32; 3], shared_bytes: u32) -> Shape {
        let mut h = mix(function);
        for v in grid.into_iter().chain(block).chain([shared_bytes]) {
            h = mix(h ^ u64::from(v));
        }
        Shape(h)
    }

    /// The shape of a graph launch (the executable graph's handle).
    pub fn graph(exec: u64) -> Shape {
        Shape(mix(exec ^ 0x6772_6170_6800_0000))
    }
}

/// splitmix64's finaliser: spreads the handle's and dimensions' bits over the table's index.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[derive(Clone, Copy, Debug)]
struct History {
    shape: Shape,
    /// The latest samples, ns (saturating at `u32::MAX`, 4.3 s).
    ns: [u32; HISTORY],
    len: u8,
    next: u8,
}

impl History {
    const EMPTY: History = History {
        shape: Shape(0),
        ns: [0; HISTORY],
        len: 0,
        next: 0,
    };
}

/// One thread's launch shapes and what their samples took.
#[derive(Debug)]
pub struct SliceFilter {
    table: Vec<History>,
    capped: u64,
    removed_ns: u64,
}

impl Default for SliceFilter {
    fn default() -> SliceFilter {
        SliceFilter {
            table: vec![History::EMPTY; SHAPES],
            capped: 0,
            removed_ns: 0,
        }
    }
}

impl SliceFilter {
    /// What a sample of `shape` that took `ns` counts: `ns`, or the sixth-longest of the shape's
    /// last 16 samples (this one included) if that is less.
    pub fn count(&mut self, shape: Shape, ns: u64) -> u64 {
        let h = &mut self.table[(shape.0 % SHAPES as u64) as usize];
        if h.shape != shape || h.len == 0 {
            *h = History {
                shape,
                ..History::EMPTY
            };
        }
        h.ns[usize::from(h.next)] = u32::try_from(ns).unwrap_or(u32::MAX);
        h.next = ((usize::from(h.next) + 1) % HISTORY) as u8;
        h.len = (usize::from(h.len) + 1).min(HISTORY) as u8;
        let len = usize::from(h.len);
        if len < MIN_HISTORY {
            return ns;
        }
        let mut sorted = h.ns;
        sorted[..len].sort_unstable();
        // The sixth-longest of 16 (of fewer, the same rank from the top in proportion).
        let cap = u64::from(sorted[len * 5 / 8]);
        if ns > cap {
            self.capped += 1;
            self.removed_ns = self.removed_ns.saturating_add(ns - cap);
            cap
        } else {
            ns
        }
    }

    /// Samples capped so far, and the time removed from them, ns.
    pub fn capped(&self) -> (u64, u64) {
        (self.capped, self.removed_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: Shape = Shape(42);

    /// A 30 us kernel, one sample in five hit by a 2 ms slice of another context: each hit
    /// counts what the kernel usually takes, and the rest as measured.
    #[test]
    fn a_sample_hit_by_another_contexts_slice_counts_what_the_launch_usually_takes() {
        let mut f = SliceFilter::default();
        let mut counted = 0;
        for i in 0..100u64 {
            let true_ns = 30_000 + (i % 3) * 100;
            let hit = i % 5 == 4;
            let ns = if hit { true_ns + 2_000_000 } else { true_ns };
            let c = f.count(K, ns);
            if hit && i >= MIN_HISTORY as u64 {
                assert!(c <= 30_200, "sample {i} counted {c}");
            }
            counted += c;
        }
        let truth: u64 = (0..100u64).map(|i| 30_000 + (i % 3) * 100).sum();
        // The hits before the history is long enough count in full (sample 4).
        let over = counted as f64 / truth as f64 - 1.0;
        assert!(over < 0.7 && over > -0.01, "{over}");
        let (capped, removed) = f.capped();
        assert_eq!(capped, 19);
        assert!(removed > 19 * 1_900_000, "{removed}");
        // Past the first samples the estimate is within 1% of the work.
        let mut f = SliceFilter::default();
        let warm: u64 = (0..16).map(|_| f.count(K, 30_000)).sum();
        assert_eq!(warm, 16 * 30_000);
        let later: u64 = (0..1_000u64)
            .map(|i| f.count(K, if i % 5 == 0 { 2_030_000 } else { 30_000 }))
            .sum();
        assert_eq!(later, 1_000 * 30_000);
    }

    /// Shapes are kept apart: a long launch is not capped by a short one's history.
    #[test]
    fn shapes_have_histories_of_their_own() {
        let mut f = SliceFilter::default();
        let short = Shape::kernel(0x7f00_1000, [132, 1, 1], [256, 1, 1], 0);
        let long = Shape::kernel(0x7f00_1000, [1024, 8, 1], [256, 1, 1], 0);
        assert_ne!(short, long);
        assert_ne!(
            Shape::graph(0x7f00_1000),
            Shape::kernel(0x7f00_1000, [0; 3], [0; 3], 0)
        );
        for _ in 0..32 {
            assert_eq!(f.count(short, 10_000), 10_000);
            assert_eq!(f.count(long, 900_000), 900_000);
        }
        assert_eq!(f.capped(), (0, 0));
    }

    /// A launch whose time changes for good (a new input size under one shape) is counted as
    /// measured again within a few samples, not held at its old time.
    #[test]
    fn a_shape_whose_time_changes_is_followed() {
        let mut f = SliceFilter::default();
        for _ in 0..HISTORY {
            f.count(K, 10_000);
        }
        let after: Vec<u64> = (0..HISTORY).map(|_| f.count(K, 50_000)).collect();
        let first_full = after.iter().position(|&c| c == 50_000).expect("followed");
        assert!(first_full <= HISTORY * 3 / 8, "{first_full}");
        assert!(after[first_full..].iter().all(|&c| c == 50_000));
    }

    /// The table is bounded: shapes that land on one entry replace each other's history.
    #[test]
    fn the_table_is_bounded_and_a_colliding_shape_starts_again() {
        let mut f = SliceFilter::default();
        let a = Shape(5);
        let b = Shape(5 + SHAPES as u64);
        for _ in 0..HISTORY {
            f.count(a, 1_000);
        }
        // b starts with no history: its first samples count as measured.
        for _ in 0..MIN_HISTORY - 1 {
            assert_eq!(f.count(b, 1_000_000), 1_000_000);
        }
        assert_eq!(f.table.len(), SHAPES);
        // Saturating sample times do not overflow.
        for _ in 0..HISTORY {
            f.count(a, u64::MAX);
        }
        assert_eq!(f.count(a, 7), 7);
    }
}
