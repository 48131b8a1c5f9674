//! The two packed words of the protocol, which the writer sets and the reader decodes: the
//! header's init word (phase, the initialiser's pid, when it started) and each slot's claim word
//! (generation, phase, owner pid). Below both sides, so that neither imports the other.

// The header's init word: phase in bits 62..64, pid in 40..62, start time (ms) in 0..40.
const INIT_PHASE_SHIFT: u32 = 62;
const INIT_PID_SHIFT: u32 = 40;
const INIT_PID_MASK: u64 = (1 << 22) - 1;
pub(crate) const INIT_MS_MASK: u64 = (1 << 40) - 1;
pub(crate) const PHASE_UNINIT: u64 = 0;
pub(crate) const PHASE_INITIALISING: u64 = 1;
pub(crate) const PHASE_READY: u64 = 2;

pub(crate) fn init_word(phase: u64, pid: u32, ms: u64) -> u64 {
    phase << INIT_PHASE_SHIFT | (pid as u64 & INIT_PID_MASK) << INIT_PID_SHIFT | (ms & INIT_MS_MASK)
}
pub(crate) fn init_phase(word: u64) -> u64 {
    word >> INIT_PHASE_SHIFT
}
pub(crate) fn init_pid(word: u64) -> u32 {
    ((word >> INIT_PID_SHIFT) & INIT_PID_MASK) as u32
}
pub(crate) fn init_ms(word: u64) -> u64 {
    word & INIT_MS_MASK
}

// A slot's claim word: generation in bits 40..64, phase in 32..40, pid in 0..32.
pub(crate) const PHASE_FREE: u64 = 0;
pub(crate) const PHASE_CLAIMING: u64 = 1;
pub(crate) const PHASE_LIVE: u64 = 2;
pub(crate) const PHASE_RECLAIMING: u64 = 3;
const SLOT_GEN_SHIFT: u32 = 40;
const SLOT_PHASE_SHIFT: u32 = 32;
const SLOT_GEN_MASK: u64 = (1 << 24) - 1;
pub(crate) fn slot_word(generation: u64, phase: u64, pid: u32) -> u64 {
    (generation & SLOT_GEN_MASK) << SLOT_GEN_SHIFT
        | (phase & 0xff) << SLOT_PHASE_SHIFT
        | u64::from(pid)
}
pub(crate) fn slot_phase(word: u64) -> u64 {
    (word >> SLOT_PHASE_SHIFT) & 0xff
}
pub(crate) fn slot_generation(word: u64) -> u64 {
    (word >> SLOT_GEN_SHIFT) & SLOT_GEN_MASK
}
pub(crate) fn slot_pid(word: u64) -> u32 {
    word as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_words_round_trip() {
        let w = init_word(PHASE_INITIALISING, 4_194_303, 123_456);
        assert_eq!(init_phase(w), PHASE_INITIALISING);
        assert_eq!(init_pid(w), 4_194_303);
        assert_eq!(init_ms(w), 123_456);
        assert_eq!(init_phase(0), PHASE_UNINIT);
    }

    #[test]
    fn slot_words_round_trip() {
        let w = slot_word(SLOT_GEN_MASK, PHASE_RECLAIMING, u32::MAX);
        assert_eq!(slot_generation(w), SLOT_GEN_MASK);
        assert_eq!(slot_phase(w), PHASE_RECLAIMING);
        assert_eq!(slot_pid(w), u32::MAX);
        assert_eq!(
            slot_generation(slot_word(SLOT_GEN_MASK + 1, PHASE_FREE, 0)),
            0,
            "wraps"
        );
    }
}
