//! Whether a request gets a loan, and of how many chunks. Everything it weighs the agent
//! measured itself: the asking process is the socket's peer (`SO_PEERCRED`), its freeze is the
//! mark in the control block beside a region it holds a slot in, its size is what NVML says it
//! holds on the GPUs; the request says only how much of that it wants.

use region::{
    OwnFreeze,
    freeze_pool::{CHUNK_BYTES, MAX_CHUNKS, Request, Status},
};

use crate::checkpoint::measure::GpuUse;

/// The bits of a control generation a slot's answer holds (`region::OwnFreeze`: 56).
const ANSWER_GENERATION_MASK: u64 = (1 << 56) - 1;

/// Whether `answer` is for the mark of `generation` or a later one.
pub(super) fn answers_at_least(answer: OwnFreeze, generation: u64) -> bool {
    answer.generation >= generation & ANSWER_GENERATION_MASK
}

/// What NVML says a process holds on the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gpu {
    /// NVML was not read (no NVML in the daemon, or a call failed).
    NotRead,
    /// Listed on a GPU without a figure (MIG without the rights).
    NoFigure,
    /// Its bytes over every GPU (0: listed on none).
    Bytes(u64),
}

/// What `gpus` (`None`: not read) say `pid` holds.
pub(super) fn gpu_of(gpus: Option<&[GpuUse]>, pid: u32) -> Gpu {
    let Some(gpus) = gpus else {
        return Gpu::NotRead;
    };
    let mut bytes = 0u64;
    for (_, used) in gpus
        .iter()
        .flat_map(|g| &g.processes)
        .filter(|p| p.0 == pid)
    {
        match used {
            Some(b) => bytes = bytes.saturating_add(*b),
            None => return Gpu::NoFigure,
        }
    }
    Gpu::Bytes(bytes)
}

/// The in-process freeze of the asking process, as the agent found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Freezing {
    /// The generation of the control block marking its container `InProcess`.
    pub generation: u64,
    /// What its slot answers now (`None`: the word says nothing a limiter writes).
    pub answer: Option<OwnFreeze>,
}

/// The chunks to lend for `request`, or the refusal: not freezing in-process (no mark, or its
/// slot answered the mark already), holding a loan already, more than [`MAX_CHUNKS`] or more
/// than NVML says the process holds plus one chunk, or not measured. Whether enough chunks are
/// ready is the pool's to say ([`Status::Empty`]).
pub(super) fn decide(
    request: Request,
    freezing: Option<Freezing>,
    holds_loan: bool,
    gpu: Gpu,
) -> Result<u32, Status> {
    let Some(f) = freezing else {
        return Err(Status::NotFreezing);
    };
    if f.answer.is_some_and(|a| answers_at_least(a, f.generation)) {
        return Err(Status::NotFreezing);
    }
    if holds_loan {
        return Err(Status::AlreadyLent);
    }
    let chunks = request.chunks();
    if chunks > MAX_CHUNKS {
        return Err(Status::TooMuch);
    }
    let held = match gpu {
        Gpu::NotRead | Gpu::NoFigure => return Err(Status::Unknown),
        Gpu::Bytes(b) => b,
    };
    if u64::from(chunks) * CHUNK_BYTES > held.saturating_add(CHUNK_BYTES) {
        return Err(Status::TooMuch);
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use region::OwnFreezeState;

    use super::*;

    const GIB: u64 = 1 << 30;

    fn freezing(generation: u64) -> Option<Freezing> {
        Some(Freezing {
            generation,
            answer: Some(OwnFreeze {
                state: OwnFreezeState::Running,
                generation: generation - 2,
            }),
        })
    }

    /// Each refusal, and what passes: the mark, the slot's answer, a loan held, the size against
    /// `MAX_CHUNKS` and NVML's figure plus a chunk, NVML absent or without a figure.
    #[test]
    fn each_refusal_is_decided_from_what_the_agent_measured() {
        let ask = |bytes| Request { bytes };
        let gpu = Gpu::Bytes(16 * GIB);
        assert_eq!(decide(ask(16 * GIB), freezing(8), false, gpu), Ok(16));
        assert_eq!(decide(ask(17 * GIB), freezing(8), false, gpu), Ok(17));
        assert_eq!(decide(ask(1), freezing(8), false, gpu), Ok(1));
        assert_eq!(
            decide(ask(17 * GIB + 1), freezing(8), false, gpu),
            Err(Status::TooMuch),
            "more than NVML's figure plus a chunk"
        );
        assert_eq!(
            decide(ask(u64::MAX), freezing(8), false, Gpu::Bytes(u64::MAX)),
            Err(Status::TooMuch),
            "more than MAX_CHUNKS"
        );
        assert_eq!(
            decide(ask(GIB), freezing(8), false, Gpu::Bytes(0)),
            Ok(1),
            "listed on no GPU: one chunk at most"
        );
        assert_eq!(
            decide(ask(2 * GIB), freezing(8), false, Gpu::Bytes(0)),
            Err(Status::TooMuch)
        );
        assert_eq!(decide(ask(GIB), None, false, gpu), Err(Status::NotFreezing));
        for state in [
            OwnFreezeState::Frozen,
            OwnFreezeState::Failed,
            OwnFreezeState::Running,
        ] {
            let answered = Some(Freezing {
                generation: 8,
                answer: Some(OwnFreeze {
                    state,
                    generation: 8,
                }),
            });
            assert_eq!(
                decide(ask(GIB), answered, false, gpu),
                Err(Status::NotFreezing),
                "its freeze for the mark is over ({state:?})"
            );
        }
        let silent = Some(Freezing {
            generation: 8,
            answer: None,
        });
        assert_eq!(decide(ask(GIB), silent, false, gpu), Ok(1));
        assert_eq!(
            decide(ask(GIB), freezing(8), true, gpu),
            Err(Status::AlreadyLent)
        );
        assert_eq!(
            decide(ask(GIB), freezing(8), false, Gpu::NotRead),
            Err(Status::Unknown),
            "the pool needs NVML"
        );
        assert_eq!(
            decide(ask(GIB), freezing(8), false, Gpu::NoFigure),
            Err(Status::Unknown)
        );
    }

    #[test]
    fn nvml_is_read_per_process_over_every_gpu() {
        let gpus = [
            GpuUse {
                total: Some(80 * GIB),
                processes: vec![(1, Some(GIB)), (2, Some(2 * GIB))],
            },
            GpuUse {
                total: Some(80 * GIB),
                processes: vec![(1, Some(3 * GIB)), (3, None)],
            },
        ];
        assert_eq!(gpu_of(Some(&gpus), 1), Gpu::Bytes(4 * GIB));
        assert_eq!(gpu_of(Some(&gpus), 3), Gpu::NoFigure);
        assert_eq!(gpu_of(Some(&gpus), 4), Gpu::Bytes(0));
        assert_eq!(gpu_of(None, 1), Gpu::NotRead);
    }

    #[test]
    fn an_answer_counts_from_the_marks_generation_on_in_56_bits() {
        let at = |generation| OwnFreeze {
            state: OwnFreezeState::Running,
            generation,
        };
        assert!(answers_at_least(at(8), 8));
        assert!(answers_at_least(at(10), 8));
        assert!(!answers_at_least(at(6), 8));
        let big = (1u64 << 56) + 8;
        assert!(answers_at_least(at(8), big), "the slot keeps 56 bits");
    }
}
