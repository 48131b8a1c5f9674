//! The shared-memory accounting region (see docs/region.md).
