//! Span emission: the return probes' record of one call, written to the `SPANS` ring buffer when
//! tracing is on and the call is sampled.

use agent_common::maps::{Health, SPAN_NCCL, SPAN_SAMPLED, SPAN_SLOW, SpanEvent};
use aya_ebpf::helpers::bpf_get_current_comm;

use crate::{
    maps::{SAMPLE_COUNTER, SPANS, TRACE_ON, TRACE_SAMPLE_EVERY, TRACE_SLOW_NS, global},
    shared::count,
};

/// The fields of a span event that the return probes know.
pub(crate) struct Call {
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) cgroup_id: u64,
    pub(crate) bytes: u64,
    pub(crate) comm: u64,
    pub(crate) stream: u64,
    pub(crate) pid_tgid: u64,
    pub(crate) result: u32,
    pub(crate) api: u16,
}

/// Writes a span event if the call is sampled; a full ring buffer is counted.
#[inline(always)]
pub(crate) fn maybe_span(c: &Call, nccl: bool) {
    if global(&TRACE_ON) == 0 {
        return;
    }
    let slow = global(&TRACE_SLOW_NS);
    let reason = if nccl {
        SPAN_NCCL
    } else if slow != 0 && c.end_ns.saturating_sub(c.start_ns) >= slow {
        SPAN_SLOW
    } else {
        let every = global(&TRACE_SAMPLE_EVERY);
        let Some(n) = SAMPLE_COUNTER.get_ptr_mut(0) else {
            return;
        };
        // SAFETY: per-CPU slot, written only by this CPU while this program runs.
        let v = unsafe {
            *n += 1;
            *n
        };
        if every == 0 || v % every != 0 {
            return;
        }
        SPAN_SAMPLED
    };
    let Some(mut entry) = SPANS.reserve::<SpanEvent>(0) else {
        count(Health::RingFull);
        return;
    };
    let task = bpf_get_current_comm().unwrap_or([0; 16]);
    entry.write(SpanEvent {
        start_ns: c.start_ns,
        end_ns: c.end_ns,
        cgroup_id: c.cgroup_id,
        bytes: c.bytes,
        comm: c.comm,
        stream: c.stream,
        tgid: (c.pid_tgid >> 32) as u32,
        tid: c.pid_tgid as u32,
        result: c.result,
        api: c.api,
        reason,
        _pad: 0,
        task,
    });
    entry.submit(0);
}
