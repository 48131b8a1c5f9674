//! Adding API rows up: a process's calls since an earlier snapshot, several processes' rows per
//! (API, source), a process's rows per any key (its kinds, say). The views call these rather than
//! adding counters themselves, so that every view adds the same counters the same way.

use std::collections::BTreeMap;

use agent_common::hist::HIST_BUCKETS;

use super::{ApiUsage, Probed, Process, Source};

impl ApiUsage {
    /// Adds `other`'s counters and histogram to this row's (its API, kind and source stay; the
    /// caller chooses which rows go together). The sum is an estimate if either is, and what
    /// the probes saw of it adds up too (all of an exact row).
    pub fn add(&mut self, other: &ApiUsage) {
        if self.is_estimated() || other.is_estimated() {
            let (a, b) = (self.probed_figures(), other.probed_figures());
            self.probed = Some(Probed {
                calls: a.calls + b.calls,
                errors: a.errors + b.errors,
                bytes: a.bytes + b.bytes,
                total_ns: a.total_ns + b.total_ns,
            });
        }
        self.calls += other.calls;
        self.errors += other.errors;
        self.bytes += other.bytes;
        self.total_ns += other.total_ns;
        self.hook_ns += other.hook_ns;
        self.denied += other.denied;
        if self.hist.len() < other.hist.len() {
            self.hist.resize(other.hist.len(), 0);
        }
        for (d, s) in self.hist.iter_mut().zip(&other.hist) {
            *d += s;
        }
    }

    /// What the probes saw of this row: all of it unless it is an estimate.
    fn probed_figures(&self) -> Probed {
        self.probed.unwrap_or(Probed {
            calls: self.calls,
            errors: self.errors,
            bytes: self.bytes,
            total_ns: self.total_ns,
        })
    }

    /// This row's API, kind and source, with no calls.
    fn zeroed(&self) -> ApiUsage {
        ApiUsage {
            calls: 0,
            errors: 0,
            bytes: 0,
            total_ns: 0,
            hook_ns: 0,
            denied: 0,
            hist: vec![0; self.hist.len()],
            probed: None,
            ..self.clone()
        }
    }
}

/// API rows added up per (API, source).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApiSums(BTreeMap<(String, Source), ApiUsage>);

impl ApiSums {
    /// The effective rows ([`Process::effective_apis`]) of `processes`, added up.
    pub fn effective_of(processes: &[&Process]) -> ApiSums {
        let mut sums = ApiSums::default();
        for p in processes {
            for a in p.effective_apis() {
                sums.add(a);
            }
        }
        sums
    }

    pub fn add(&mut self, row: &ApiUsage) {
        self.0
            .entry((row.api.clone(), row.source))
            .or_insert_with(|| row.zeroed())
            .add(row);
    }

    /// The sums, by API then source.
    pub fn rows(&self) -> impl Iterator<Item = &ApiUsage> {
        self.0.values()
    }

    pub fn into_rows(self) -> Vec<ApiUsage> {
        self.0.into_values().collect()
    }
}

/// An API row's counters without its names, the histogram in a fixed array: what a view keeps
/// per series (no string is cloned to add a row in).
#[derive(Clone, Debug, PartialEq)]
pub struct ApiCounts {
    pub calls: u64,
    pub errors: u64,
    pub bytes: u64,
    pub total_ns: u64,
    pub hook_ns: u64,
    pub denied: u64,
    pub hist: [u64; HIST_BUCKETS],
}

impl Default for ApiCounts {
    fn default() -> ApiCounts {
        ApiCounts {
            calls: 0,
            errors: 0,
            bytes: 0,
            total_ns: 0,
            hook_ns: 0,
            denied: 0,
            hist: [0; HIST_BUCKETS],
        }
    }
}

impl ApiCounts {
    /// Adds an API row's counters (buckets past [`HIST_BUCKETS`] are not kept).
    pub fn add_row(&mut self, a: &ApiUsage) {
        self.calls += a.calls;
        self.errors += a.errors;
        self.bytes += a.bytes;
        self.total_ns += a.total_ns;
        self.hook_ns += a.hook_ns;
        self.denied += a.denied;
        for (d, s) in self.hist.iter_mut().zip(&a.hist) {
            *d += s;
        }
    }

    pub fn add(&mut self, o: &ApiCounts) {
        self.calls += o.calls;
        self.errors += o.errors;
        self.bytes += o.bytes;
        self.total_ns += o.total_ns;
        self.hook_ns += o.hook_ns;
        self.denied += o.denied;
        for (d, s) in self.hist.iter_mut().zip(&o.hist) {
            *d += s;
        }
    }

    /// Each counter and bucket the larger of the two.
    pub fn max_with(&mut self, o: &ApiCounts) {
        self.calls = self.calls.max(o.calls);
        self.errors = self.errors.max(o.errors);
        self.bytes = self.bytes.max(o.bytes);
        self.total_ns = self.total_ns.max(o.total_ns);
        self.hook_ns = self.hook_ns.max(o.hook_ns);
        self.denied = self.denied.max(o.denied);
        for (d, s) in self.hist.iter_mut().zip(&o.hist) {
            *d = (*d).max(*s);
        }
    }
}

impl Process {
    /// The calls of each of its API rows since `before` (this process in an earlier snapshot;
    /// without it, since the counters started): see [`ApiUsage::since`]. Every row, idle ones
    /// too.
    pub fn apis_since<'a>(
        &'a self,
        before: Option<&'a Process>,
    ) -> impl Iterator<Item = ApiUsage> + 'a {
        self.apis
            .iter()
            .map(move |a| a.since(Process::same_row(before, a)))
    }

    /// As [`Process::apis_since`], with what the probes saw of sampled kinds in place of the
    /// estimates ([`ApiUsage::as_probed`]): for estimators of their own (`attribute`).
    pub fn probed_apis_since<'a>(
        &'a self,
        before: Option<&'a Process>,
    ) -> impl Iterator<Item = ApiUsage> + 'a {
        self.apis.iter().map(move |a| {
            let earlier = Process::same_row(before, a).map(ApiUsage::as_probed);
            a.as_probed().since(earlier.as_ref())
        })
    }

    /// `before`'s row of the same API and source as `a`.
    fn same_row<'a>(before: Option<&'a Process>, a: &ApiUsage) -> Option<&'a ApiUsage> {
        before.and_then(|b| {
            b.apis
                .iter()
                .find(|e| e.api == a.api && e.source == a.source)
        })
    }

    /// Its effective API rows ([`Process::effective_apis`]: one source per API) added up per
    /// `key` (its kind, say, or its API and kind).
    pub fn effective_counts_by<K: Ord>(
        &self,
        mut key: impl FnMut(&ApiUsage) -> K,
    ) -> BTreeMap<K, ApiCounts> {
        let mut by: BTreeMap<K, ApiCounts> = BTreeMap::new();
        for a in self.effective_apis() {
            by.entry(key(a)).or_default().add_row(a);
        }
        by
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(api: &str, kind: &str, source: Source, calls: u64, hist: Vec<u64>) -> ApiUsage {
        ApiUsage {
            api: api.into(),
            kind: kind.into(),
            source,
            calls,
            errors: calls / 10,
            bytes: calls * 100,
            total_ns: calls * 1000,
            hook_ns: calls * 10,
            denied: calls / 2,
            hist,
            latency: None,
            probed: None,
        }
    }

    #[test]
    fn a_row_added_to_another_adds_every_counter_and_bucket() {
        let mut a = row("cuMemAlloc_v2", "alloc", Source::Probes, 10, vec![1, 2]);
        a.add(&row(
            "cuMemAlloc_v2",
            "alloc",
            Source::Probes,
            4,
            vec![0, 1, 3],
        ));
        assert_eq!(
            (a.calls, a.errors, a.bytes, a.total_ns, a.hook_ns, a.denied),
            (14, 1, 1400, 14_000, 140, 7)
        );
        assert_eq!(a.hist, [1, 3, 3], "a longer histogram widens the sum");
        assert_eq!(a.api, "cuMemAlloc_v2");
    }

    #[test]
    fn sums_are_per_api_and_source_across_processes() {
        let p1 = Process::with_apis(vec![
            row("cuLaunchKernel", "launch", Source::Probes, 5, vec![5]),
            row("cuMemAlloc_v2", "alloc", Source::Limiter, 2, vec![2]),
            // Shadowed by the limiter's row of the same API: not effective.
            row("cuMemAlloc_v2", "alloc", Source::Probes, 9, vec![9]),
        ]);
        let p2 = Process::with_apis(vec![
            row("cuLaunchKernel", "launch", Source::Probes, 7, vec![0, 7]),
            row("cuMemAlloc_v2", "alloc", Source::Probes, 3, vec![3]),
        ]);
        let rows = ApiSums::effective_of(&[&p1, &p2]).into_rows();
        let got: Vec<(&str, Source, u64, &[u64])> = rows
            .iter()
            .map(|r| (r.api.as_str(), r.source, r.calls, r.hist.as_slice()))
            .collect();
        assert_eq!(
            got,
            [
                ("cuLaunchKernel", Source::Probes, 12, &[5, 7][..]),
                ("cuMemAlloc_v2", Source::Probes, 3, &[3][..]),
                ("cuMemAlloc_v2", Source::Limiter, 2, &[2][..]),
            ]
        );
        assert_eq!(rows[0].kind, "launch");
    }

    #[test]
    fn a_process_since_an_earlier_snapshot_counts_only_the_calls_between() {
        let before = Process::with_apis(vec![
            row("cuLaunchKernel", "launch", Source::Probes, 5, vec![5, 0]),
            row("cuLaunchKernel", "launch", Source::Limiter, 50, vec![50]),
        ]);
        let now = Process::with_apis(vec![
            row("cuLaunchKernel", "launch", Source::Probes, 8, vec![6, 2]),
            row("cuLaunchKernel", "launch", Source::Limiter, 50, vec![50]),
            row("cuMemFree_v2", "free", Source::Probes, 1, vec![1]),
        ]);
        let window: Vec<ApiUsage> = now.apis_since(Some(&before)).collect();
        let got: Vec<(Source, &str, u64, &[u64])> = window
            .iter()
            .map(|a| (a.source, a.api.as_str(), a.calls, a.hist.as_slice()))
            .collect();
        assert_eq!(
            got,
            [
                (Source::Probes, "cuLaunchKernel", 3, &[1, 2][..]),
                (Source::Limiter, "cuLaunchKernel", 0, &[0][..]),
                (Source::Probes, "cuMemFree_v2", 1, &[1][..]),
            ]
        );
        let whole: Vec<u64> = now.apis_since(None).map(|a| a.calls).collect();
        assert_eq!(whole, [8, 50, 1]);
    }

    #[test]
    fn a_process_counted_per_kind_adds_its_effective_rows() {
        let p = Process::with_apis(vec![
            row("cuLaunchKernel", "launch", Source::Probes, 5, vec![5]),
            row("cuLaunchKernelEx", "launch", Source::Probes, 2, vec![0, 2]),
            row("cuMemAlloc_v2", "alloc", Source::Limiter, 2, vec![2]),
            row("cuMemAlloc_v2", "alloc", Source::Probes, 9, vec![9]),
        ]);
        let by_kind = p.effective_counts_by(|a| (a.kind.clone(), a.source));
        let launch = &by_kind[&("launch".to_owned(), Source::Probes)];
        assert_eq!((launch.calls, &launch.hist[..2]), (7, &[5, 2][..]));
        let alloc = &by_kind[&("alloc".to_owned(), Source::Limiter)];
        assert_eq!((alloc.calls, alloc.denied), (2, 1));
        assert_eq!(by_kind.len(), 2, "the probes' shadowed row is not counted");
    }

    #[test]
    fn counts_add_and_keep_the_larger_of_each_counter() {
        let mut a = ApiCounts::default();
        a.add_row(&row("x", "other", Source::Probes, 10, vec![1, 9]));
        let mut b = ApiCounts::default();
        b.add_row(&row("x", "other", Source::Probes, 4, vec![4]));
        let mut sum = a.clone();
        sum.add(&b);
        assert_eq!(
            (sum.calls, sum.bytes, &sum.hist[..2]),
            (14, 1400, &[5, 9][..])
        );
        b.hist[0] = 7;
        let mut floor = a.clone();
        floor.max_with(&b);
        assert_eq!(
            (floor.calls, floor.denied, &floor.hist[..2]),
            (10, 5, &[7, 9][..])
        );
    }
}

#[cfg(test)]
mod estimated_sums {
    use super::*;

    /// An estimate added to an exact row is an estimate, and what the probes saw of the sum is
    /// the estimate's probed calls plus all of the exact row's.
    #[test]
    fn an_estimate_added_to_an_exact_row_is_an_estimate() {
        let exact = ApiUsage {
            api: "cuStreamSynchronize".into(),
            kind: "sync".into(),
            source: Source::Probes,
            calls: 10,
            errors: 0,
            bytes: 0,
            total_ns: 100,
            hook_ns: 0,
            denied: 0,
            hist: vec![],
            latency: None,
            probed: None,
        };
        let sampled = ApiUsage {
            calls: 400,
            total_ns: 4_000,
            probed: Some(Probed {
                calls: 100,
                errors: 0,
                bytes: 0,
                total_ns: 1_000,
            }),
            ..exact.clone()
        };
        let mut sum = exact.clone();
        sum.add(&sampled);
        assert_eq!(sum.calls, 410);
        assert_eq!(
            sum.probed.map(|p| (p.calls, p.total_ns)),
            Some((110, 1_100))
        );
        let mut exact_only = exact.clone();
        exact_only.add(&exact);
        assert!(!exact_only.is_estimated());
    }
}
