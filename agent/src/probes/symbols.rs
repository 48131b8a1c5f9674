//! Resolving the traced API's symbols in a driver library to file offsets, once per library file,
//! so that a symbol that one driver version lacks is skipped instead of failing the whole attach.

use std::path::Path;

use agent_common::ApiId;
use object::{Object, ObjectSection, ObjectSymbol};

use super::ProbeError;

/// The first instruction of a probed function decides what a uprobe hit costs: the kernel
/// emulates `push` and `nop5`, but must single-step most others (about 30x slower in a VM).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Prologue {
    /// `push %rbp` and other pushes: emulated.
    Push,
    /// A 5-byte nop: optimised to a call on recent kernels.
    Nop5,
    /// `endbr64` (CET builds): single-stepped.
    Endbr64,
    /// Anything else: usually single-stepped.
    Other,
}

impl Prologue {
    pub fn classify(code: &[u8]) -> Prologue {
        match code {
            [0x55, ..] | [0x41, 0x50..=0x57, ..] | [0x50..=0x57, ..] => Prologue::Push,
            [0x0f, 0x1f, 0x44, 0x00, 0x00, ..] => Prologue::Nop5,
            [0xf3, 0x0f, 0x1e, 0xfa, ..] => Prologue::Endbr64,
            _ => Prologue::Other,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ResolvedSymbol {
    pub api: ApiId,
    /// Offset of the function's first byte in the file (what the kernel's uprobe wants).
    pub file_offset: u64,
    pub prologue: Prologue,
}

#[derive(Clone, Debug, Default)]
pub struct SymbolTable {
    pub found: Vec<ResolvedSymbol>,
    /// Traced APIs this library does not export.
    pub missing: Vec<ApiId>,
}

/// Resolves `apis` (and any extra named symbols) in the ELF file at `path`.
pub fn resolve(
    path: &Path,
    apis: impl IntoIterator<Item = ApiId>,
) -> Result<SymbolTable, ProbeError> {
    let data = std::fs::read(path).map_err(|source| ProbeError::ReadLibrary {
        path: path.to_owned(),
        source,
    })?;
    resolve_in(&data, path, apis)
}

pub(crate) fn resolve_in(
    data: &[u8],
    path: &Path,
    apis: impl IntoIterator<Item = ApiId>,
) -> Result<SymbolTable, ProbeError> {
    let file = object::File::parse(data).map_err(|e| ProbeError::NotElf {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let mut table = SymbolTable::default();
    for api in apis {
        // NCCL exports `ncclX` as a weak alias of `pncclX` (the profiling interface): take the
        // alias, or the strong symbol where a build lacks the alias.
        let found = find_function(&file, data, api.name()).or_else(|| {
            api.name()
                .starts_with("nccl")
                .then(|| find_function(&file, data, &format!("p{}", api.name())))
                .flatten()
        });
        match found {
            Some((file_offset, prologue)) => table.found.push(ResolvedSymbol {
                api,
                file_offset,
                prologue,
            }),
            None => table.missing.push(api),
        }
    }
    Ok(table)
}

/// File offset and prologue of a defined function symbol (dynamic symbols first, as the loader
/// sees them, then the static symbol table).
pub(crate) fn find_function(
    file: &object::File<'_>,
    data: &[u8],
    name: &str,
) -> Option<(u64, Prologue)> {
    let sym = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.is_definition() && s.name() == Ok(name))?;
    let section = file.section_by_index(sym.section_index()?).ok()?;
    let (section_offset, _) = section.file_range()?;
    let offset = sym
        .address()
        .checked_sub(section.address())?
        .checked_add(section_offset)?;
    let code = data
        .get(offset as usize..)
        .map(|c| &c[..c.len().min(8)])
        .unwrap_or(&[]);
    Some((offset, Prologue::classify(code)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_prologues() {
        assert_eq!(
            Prologue::classify(&[0x55, 0x48, 0x89, 0xe5]),
            Prologue::Push
        );
        assert_eq!(Prologue::classify(&[0x41, 0x57]), Prologue::Push);
        assert_eq!(
            Prologue::classify(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55]),
            Prologue::Endbr64
        );
        assert_eq!(
            Prologue::classify(&[0x0f, 0x1f, 0x44, 0x00, 0x00]),
            Prologue::Nop5
        );
        assert_eq!(
            Prologue::classify(&[0x83, 0x3d, 0, 0, 0, 0, 0]),
            Prologue::Other
        );
        assert_eq!(Prologue::classify(&[]), Prologue::Other);
    }

    #[test]
    fn resolves_libc_functions_and_reports_missing_ones() {
        // libc is on every test machine; its `getpid` is a defined dynamic symbol.
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists())
            .expect("libc.so.6");
        let data = std::fs::read(libc).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let (off, _) = find_function(&file, &data, "getpid").expect("getpid is defined");
        assert!(off > 0 && (off as usize) < data.len());
        assert!(find_function(&file, &data, "cuMemAlloc_v2").is_none());
        let table = resolve_in(&data, libc, ApiId::all()).unwrap();
        assert!(table.found.is_empty());
        assert_eq!(table.missing.len(), agent_common::API_COUNT);
    }

    #[test]
    fn rejects_non_elf_files() {
        let err = resolve_in(b"#!/bin/sh\n", Path::new("/x"), ApiId::all()).unwrap_err();
        assert!(matches!(err, ProbeError::NotElf { .. }), "{err}");
    }
}
