//! Resolving the traced API's symbols in a driver library to file offsets, once per library file,
//! so that a symbol that one driver version lacks is skipped instead of failing the whole attach.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    ops::Range,
    path::Path,
};

use agent_common::ApiId;
use object::{Object, ObjectSection, ObjectSymbol, ReadRef};
use tenant_fs::TenantFile;

use super::error::ProbeError;
use crate::{discovery::LibraryFile, model::probing::Prologue};

/// `endbr64`, the landing pad that CET builds put first in every function that may be reached
/// indirectly. The kernel does not emulate it, so a probe on it is single-stepped (6.5 us a hit on
/// a GPU host, against 1.4 us on a `push`); it changes no register, flag, memory or the stack, and
/// every call of the function passes the instruction after it, so that is where the probe goes.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// How far into a function the probe may move past instructions the kernel would single-step.
const MAX_SKIP: usize = 24;
/// The bytes of a function read to classify it: room for the skipped instructions and the one
/// probed.
const PROLOGUE_BYTES: u64 = 32;

fn is_push(code: &[u8]) -> bool {
    matches!(
        code,
        [0x55, ..] | [0x41, 0x50..=0x57, ..] | [0x50..=0x57, ..]
    )
}

/// A jump the kernel emulates: `jmp rel8/rel32`, `jcc rel8/rel32`.
fn is_branch(code: &[u8]) -> bool {
    matches!(
        code,
        [0xeb, ..] | [0xe9, ..] | [0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..]
    )
}

/// The length of a leading instruction that a probe may be moved past: it falls through to the
/// next instruction and changes no argument register, no stack pointer and no memory, so the
/// entry program reads the same arguments after it and a return probe finds the return address
/// where the call left it. Only these encodings (what the probed libraries start with):
/// - `cmp dword [rip + d32], imm32` (`81 3d`) and `cmp dword [rip + d32], imm8` (`83 3d`): flags
///   only (Debian's libcuda 5xx entry points);
/// - `movabs rax, imm64` (`48 b8`): `rax` only, which carries no argument of a function with a
///   fixed argument list (NCCL's `ncclCommInitRankConfig` and `ncclCommInitAll`).
fn skippable(code: &[u8]) -> Option<usize> {
    match code {
        [0x81, 0x3d, ..] if code.len() >= 10 => Some(10),
        [0x83, 0x3d, ..] if code.len() >= 7 => Some(7),
        [0x48, 0xb8, ..] if code.len() >= 10 => Some(10),
        _ => None,
    }
}

impl Prologue {
    /// The class of a function that begins with `code`, and how many bytes in its probe goes.
    /// Past a leading `endbr64` (the class is then `Endbr64` if a push follows, which is
    /// emulated); past instructions the kernel would single-step but that change nothing the
    /// probes read ([`skippable`]), onto the first one it emulates (a push, a 5-byte nop, or a
    /// jump: `Branch`); else on the first byte (or the one after the `endbr64`), `Other`.
    pub fn classify(code: &[u8]) -> (Prologue, u64) {
        let (start, after_endbr64) = match code.strip_prefix(&ENDBR64) {
            Some(_) => (ENDBR64.len(), true),
            None => (0, false),
        };
        let mut at = start;
        while at <= MAX_SKIP && at < code.len() {
            let rest = &code[at..];
            let class = match rest {
                c if is_push(c) => Some(if after_endbr64 && at == start {
                    Prologue::Endbr64
                } else {
                    Prologue::Push
                }),
                [0x0f, 0x1f, 0x44, 0x00, 0x00, ..] => Some(Prologue::Nop5),
                c if is_branch(c) => Some(Prologue::Branch),
                _ => None,
            };
            if let Some(class) = class {
                return (class, at as u64);
            }
            match skippable(rest) {
                Some(n) => at += n,
                None => break,
            }
        }
        (Prologue::Other, start as u64)
    }
}

#[derive(Clone, Debug)]
pub struct ResolvedSymbol {
    pub api: ApiId,
    /// Offset in the file of the instruction probed (what the kernel's uprobe wants): the
    /// function's first byte, or the one after its `endbr64` ([`Prologue::classify`]).
    pub file_offset: u64,
    pub prologue: Prologue,
}

#[derive(Clone, Debug, Default)]
pub struct SymbolTable {
    pub found: Vec<ResolvedSymbol>,
    /// Traced APIs this library does not export.
    pub missing: Vec<ApiId>,
}

/// Bytes of a library read at most to resolve its symbols: its headers, symbol and string tables
/// and 32 bytes per traced function (measured when it was 8: 1.1 MB of the NCCL wheel's 398 MB
/// library, 0.6 MB of Debian's 29 MB libcuda 535). A file that would need more is refused (a tenant's "libcuda" can
/// be anything, e.g. a 16 GB sparse file).
pub const MAX_SYMBOL_BYTES: u64 = 64 << 20;

/// Resolves `apis` in a driver library, opened through [`crate::discovery::open_library`] (the
/// file that was found, non-blocking, regular) and read within [`MAX_SYMBOL_BYTES`].
#[cfg(test)]
pub fn resolve(
    lib: &LibraryFile,
    apis: impl IntoIterator<Item = ApiId>,
) -> Result<SymbolTable, ProbeError> {
    let file = crate::discovery::open_library(lib)?;
    let elf = BoundedElf::new(&file)?;
    let table = resolve_in(&elf, &lib.attach_path, apis);
    if elf.over_budget.get() {
        return Err(ProbeError::NotElf {
            path: lib.attach_path.clone(),
            reason: format!(
                "reading its symbols needs more than {} MiB",
                MAX_SYMBOL_BYTES >> 20
            ),
        });
    }
    table
}

/// As [`resolve`], and the library must look like the driver it is named after (see
/// [`looks_like_driver`]): a tenant's file named `libcuda.so.<i>` that is not one is never probed.
pub fn resolve_driver(
    lib: &LibraryFile,
    apis: impl IntoIterator<Item = ApiId>,
) -> Result<SymbolTable, ProbeError> {
    let file = crate::discovery::open_library(lib)?;
    let elf = BoundedElf::new(&file)?;
    let table = resolve_in(&elf, &lib.attach_path, apis);
    let verdict = table
        .as_ref()
        .ok()
        .map(|t| looks_like_driver(&elf, lib.kind, t));
    if elf.over_budget.get() {
        return Err(ProbeError::NotElf {
            path: lib.attach_path.clone(),
            reason: format!(
                "reading its symbols needs more than {} MiB",
                MAX_SYMBOL_BYTES >> 20
            ),
        });
    }
    if let Some(Err(reason)) = verdict {
        return Err(ProbeError::NotADriver {
            path: lib.path.clone(),
            reason,
        });
    }
    table
}

/// Entry points every CUDA driver since 10.0 exports (none of the traced calls' newer variants).
pub const CUDA_CORE: [&str; 7] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuCtxCreate_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuLaunchKernel",
];
/// Entry points every NCCL 2 exports (as `ncclX` or its strong `pncclX`).
pub const NCCL_CORE: [&str; 5] = [
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommDestroy",
    "ncclAllReduce",
];

/// Whether a library looks like the driver it is named after: its dynamic symbols define every
/// core entry point of its kind ([`CUDA_CORE`], [`NCCL_CORE`]) and at least half of the traced
/// calls resolve. Measured: the test driver (libcuda 580) resolves 62 of the 68 traced CUDA
/// calls, the simulated driver all 68, NCCL 2.28's wheel and the fake NCCL all 15 NCCL calls.
pub fn looks_like_driver<'d, R: ReadRef<'d>>(
    data: R,
    kind: crate::discovery::LibraryKind,
    table: &SymbolTable,
) -> Result<(), String> {
    let file = object::File::parse(data).map_err(|e| e.to_string())?;
    let core: &[&str] = match kind {
        crate::discovery::LibraryKind::Cuda => &CUDA_CORE,
        crate::discovery::LibraryKind::Nccl => &NCCL_CORE,
    };
    let defined: std::collections::HashSet<&[u8]> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition())
        .filter_map(|s| s.name_bytes().ok())
        .collect();
    let missing: Vec<&str> = core
        .iter()
        .copied()
        .filter(|name| {
            !defined.contains(name.as_bytes()) && !defined.contains(format!("p{name}").as_bytes())
        })
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "its dynamic symbols lack {} of the entry points every {} exports ({})",
            missing.len(),
            kind.soname(),
            missing.join(", ")
        ));
    }
    let traced = table.found.len() + table.missing.len();
    if table.found.len() * 2 < traced {
        return Err(format!(
            "only {} of the {traced} traced calls resolve",
            table.found.len()
        ));
    }
    Ok(())
}

pub(crate) fn resolve_in<'d, R: ReadRef<'d>>(
    data: R,
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

/// Size of the blocks [`BoundedElf`] reads and keeps.
const BLOCK: u64 = 64 << 10;

/// A library read on demand with `pread`, in blocks kept for the parse's life, never more than
/// [`MAX_SYMBOL_BYTES`] in all: `object` parses it through [`ReadRef`] without the file being
/// read whole or mapped (a mapping of a file its owner can truncate would fault).
struct BoundedElf<'f> {
    file: &'f TenantFile,
    len: u64,
    used: Cell<u64>,
    over_budget: Cell<bool>,
    /// Block index -> its bytes.
    blocks: RefCell<HashMap<u64, Box<[u8]>>>,
    /// Copies of ranges that span blocks.
    spans: RefCell<Vec<Box<[u8]>>>,
}

impl<'f> BoundedElf<'f> {
    fn new(file: &'f TenantFile) -> Result<BoundedElf<'f>, ProbeError> {
        Ok(BoundedElf {
            len: file.current_len()?,
            file,
            used: Cell::new(0),
            over_budget: Cell::new(false),
            blocks: RefCell::new(HashMap::new()),
            spans: RefCell::new(Vec::new()),
        })
    }

    /// Reads `len` bytes at `offset` into a new buffer, charged to the budget.
    fn load(&self, offset: u64, len: u64) -> Result<Box<[u8]>, ()> {
        let used = self.used.get().saturating_add(len);
        if used > MAX_SYMBOL_BYTES {
            self.over_budget.set(true);
            return Err(());
        }
        self.used.set(used);
        let mut buf = vec![0u8; len as usize].into_boxed_slice();
        match self.file.read_at(offset, &mut buf) {
            Ok(n) if n == buf.len() => Ok(buf),
            _ => Err(()),
        }
    }

    /// Extends a borrow of a kept buffer to the reader's life.
    fn keep<'a>(&'a self, bytes: &[u8]) -> &'a [u8] {
        // SAFETY: `bytes` lies in a `Box<[u8]>` owned by `self.blocks` or `self.spans`. Boxes are
        // only ever added there, never removed or changed until `self` is dropped, and a box's
        // heap buffer does not move when the map or vector holding the box grows.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) }
    }

    fn block(&self, index: u64) -> Result<&[u8], ()> {
        if let Some(b) = self.blocks.borrow().get(&index) {
            return Ok(self.keep(b));
        }
        let start = index * BLOCK;
        let len = BLOCK.min(self.len.saturating_sub(start));
        let buf = self.load(start, len)?;
        let out = self.keep(&buf);
        self.blocks.borrow_mut().insert(index, buf);
        Ok(out)
    }
}

impl<'a> ReadRef<'a> for &'a BoundedElf<'_> {
    fn len(self) -> Result<u64, ()> {
        Ok(self.len)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        let end = offset.checked_add(size).ok_or(())?;
        if end > self.len {
            return Err(());
        }
        if offset / BLOCK == (end - 1) / BLOCK {
            let b = self.block(offset / BLOCK)?;
            let at = (offset % BLOCK) as usize;
            return Ok(&b[at..at + size as usize]);
        }
        let buf = self.load(offset, size)?;
        let out = self.keep(&buf);
        self.spans.borrow_mut().push(buf);
        Ok(out)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let end = range.end.min(self.len);
        let mut at = range.start;
        while at < end {
            let index = at / BLOCK;
            let b = self.block(index)?;
            let from = (at % BLOCK) as usize;
            let upto = (b.len() as u64).min(end - index * BLOCK) as usize;
            if let Some(i) = b
                .get(from..upto)
                .and_then(|s| s.iter().position(|&c| c == delimiter))
            {
                let found = at + i as u64;
                return self.read_bytes_at(range.start, found - range.start);
            }
            at = (index + 1) * BLOCK;
        }
        Err(())
    }
}

/// File offset of the instruction to probe in a defined function symbol (its first, or the one
/// after its `endbr64`) and its prologue class (dynamic symbols first, as the loader sees them,
/// then the static symbol table).
pub(crate) fn find_function<'d, R: ReadRef<'d>>(
    file: &object::File<'d, R>,
    data: R,
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
    let len = data.len().ok()?;
    // The function's first bytes, not past its end where the symbol says (the classification
    // must not wander into the next function).
    let mut want = len.saturating_sub(offset).min(PROLOGUE_BYTES);
    if sym.size() > 0 {
        want = want.min(sym.size());
    }
    let code = data.read_bytes_at(offset, want).unwrap_or(&[]);
    let (prologue, skip) = Prologue::classify(code);
    Some((offset + skip, prologue))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_prologues_and_probes_past_endbr64() {
        let c = Prologue::classify;
        assert_eq!(c(&[0x55, 0x48, 0x89, 0xe5]), (Prologue::Push, 0));
        assert_eq!(c(&[0x41, 0x57]), (Prologue::Push, 0));
        assert_eq!(c(&[0x0f, 0x1f, 0x44, 0x00, 0x00]), (Prologue::Nop5, 0));
        assert_eq!(c(&[0x83, 0x3d, 0, 0, 0, 0, 0]), (Prologue::Other, 0));
        assert_eq!(c(&[]), (Prologue::Other, 0));
        // CET: the probe goes on the instruction after the endbr64, classed by what it is.
        assert_eq!(c(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55]), (Prologue::Endbr64, 4));
        assert_eq!(
            c(&[0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57]),
            (Prologue::Endbr64, 4)
        );
        assert_eq!(
            c(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x08]),
            (Prologue::Other, 4)
        );
        assert_eq!(c(&[0xf3, 0x0f, 0x1e, 0xfa]), (Prologue::Other, 4));
    }

    #[test]
    fn probes_move_past_instructions_that_change_nothing_they_read() {
        let c = Prologue::classify;
        // Debian's libcuda 535: `cmpl $0x321cba00, d32(%rip)` then `je rel8`: on the `je`.
        let debian = [
            0x81, 0x3d, 0x7e, 0x92, 0x8d, 0x01, 0x00, 0xba, 0x1c, 0x32, 0x74, 0x0c, 0xff, 0x25,
        ];
        assert_eq!(c(&debian), (Prologue::Branch, 10));
        // The 8-bit immediate form, then a `jne rel32`.
        assert_eq!(
            c(&[0x83, 0x3d, 1, 2, 3, 4, 0, 0x0f, 0x85, 0, 0, 0, 0]),
            (Prologue::Branch, 7)
        );
        // NCCL's ncclCommInitRankConfig: `movabs $0x5919cafebeef, %rax` then `push %rbp`.
        let nccl = [
            0x48, 0xb8, 0xef, 0xbe, 0xfe, 0xca, 0x19, 0x59, 0, 0, 0x55, 0x48, 0x89, 0xe5,
        ];
        assert_eq!(c(&nccl), (Prologue::Push, 10));
        // Past an endbr64 too.
        let mut cet = vec![0xf3, 0x0f, 0x1e, 0xfa];
        cet.extend_from_slice(&nccl);
        assert_eq!(c(&cet), (Prologue::Push, 14));
        // A compare followed by anything else stays where it was: on the first byte.
        assert_eq!(
            c(&[0x81, 0x3d, 0, 0, 0, 0, 0, 0, 0, 0, 0x48, 0x8b, 0x07]),
            (Prologue::Other, 0)
        );
        // An instruction that writes an argument register or the stack is never skipped.
        assert_eq!(c(&[0x48, 0x83, 0xec, 0x10, 0x55]), (Prologue::Other, 0));
        assert_eq!(c(&[0x48, 0x89, 0xfe, 0x55]), (Prologue::Other, 0));
        // A truncated instruction (the function's end, or the bytes read) is not skipped over.
        assert_eq!(c(&[0x48, 0xb8, 1, 2, 3]), (Prologue::Other, 0));
        // At most MAX_SKIP bytes in: three compares (30 bytes) then a push stay `Other`.
        let mut long = Vec::new();
        for _ in 0..3 {
            long.extend_from_slice(&[0x81, 0x3d, 0, 0, 0, 0, 0, 0, 0, 0]);
        }
        long.push(0x55);
        assert_eq!(c(&long), (Prologue::Other, 0));
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
        let (off, _) = find_function(&file, &*data, "getpid").expect("getpid is defined");
        assert!(off > 0 && (off as usize) < data.len());
        assert!(find_function(&file, &*data, "cuMemAlloc_v2").is_none());
        let table = resolve_in(&*data, libc, ApiId::all()).unwrap();
        assert!(table.found.is_empty());
        assert_eq!(table.missing.len(), agent_common::API_COUNT);
    }

    /// In a CET build (gcc -fcf-protection) every function starts with `endbr64`: each is
    /// probed 4 bytes in, on the push after it.
    #[test]
    fn functions_of_a_cet_build_are_probed_past_their_endbr64() {
        let dir = tempfile::tempdir().unwrap();
        let (src, lib) = (dir.path().join("f.c"), dir.path().join("libf.so"));
        std::fs::write(&src, "int ncclAllReduce(int a) { return a + 1; }\n").unwrap();
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O0", "-fcf-protection=full", "-o"])
            .arg(&lib)
            .arg(&src)
            .status()
            .expect("cc runs (cargo xtask setup installs gcc)");
        assert!(built.success());
        let data = std::fs::read(&lib).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let api = ApiId::from_name("ncclAllReduce").unwrap();
        let table = resolve_in(&*data, &lib, [api]).unwrap();
        let sym = file
            .dynamic_symbols()
            .find(|s| s.name() == Ok("ncclAllReduce"))
            .unwrap();
        let section = file.section_by_index(sym.section_index().unwrap()).unwrap();
        let start = sym.address() - section.address() + section.file_range().unwrap().0;
        assert_eq!(&data[start as usize..start as usize + 4], &ENDBR64);
        assert_eq!(table.found.len(), 1);
        assert_eq!(table.found[0].file_offset, start + 4);
        assert_eq!(table.found[0].prologue, Prologue::Endbr64);
    }

    /// Builds a shared library from C source with `cc`.
    fn cc_lib(dir: &Path, name: &str, source: &str) -> std::path::PathBuf {
        let src = dir.join(format!("{name}.c"));
        std::fs::write(&src, source).unwrap();
        let out = dir.join(name);
        let ok = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("cc runs");
        assert!(ok.success());
        out
    }

    fn verdict(path: &Path, kind: crate::discovery::LibraryKind) -> Result<(), String> {
        let data = std::fs::read(path).unwrap();
        let probed = match kind {
            crate::discovery::LibraryKind::Cuda => &agent_common::ApiKind::PROBED[..],
            crate::discovery::LibraryKind::Nccl => &agent_common::ApiKind::NCCL_PROBED[..],
        };
        let apis = ApiId::all().filter(|a| a.spec().is_some_and(|s| probed.contains(&s.kind)));
        let table = resolve_in(&*data, path, apis).unwrap();
        looks_like_driver(&*data, kind, &table)
    }

    /// The drivers the tests use pass the rule; libc named libcuda, an ELF exporting eight `cu*`
    /// names and the fake NCCL named libcuda do not.
    #[test]
    fn only_libraries_that_look_like_their_driver_pass() {
        use crate::discovery::LibraryKind::{Cuda, Nccl};
        let dir = tempfile::tempdir().unwrap();
        for (var, kind) in [("VGPU_TEST_LIBCUDA", Cuda), ("VGPU_TEST_LIBNCCL", Nccl)] {
            if let Some(p) = std::env::var_os(var).map(std::path::PathBuf::from)
                && p.exists()
            {
                assert_eq!(verdict(&p, kind), Ok(()), "{}", p.display());
            }
        }
        let sim = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/libsimcuda.so");
        if sim.exists() {
            assert_eq!(verdict(&sim, Cuda), Ok(()));
        }
        let fake_nccl =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../testing/fake-nccl/fake_nccl.c");
        let nccl = cc_lib(
            dir.path(),
            "libnccl.so.2",
            &std::fs::read_to_string(fake_nccl).unwrap(),
        );
        assert_eq!(verdict(&nccl, Nccl), Ok(()));
        assert!(verdict(&nccl, Cuda).is_err(), "NCCL is not a CUDA driver");
        let eight = cc_lib(
            dir.path(),
            "libcuda.so.7",
            "int cuInit(int f){return 0;} int cuMemAlloc_v2(void){return 0;} \
             int cuMemFree_v2(void){return 0;} int cuLaunchKernel(void){return 0;} \
             int cuCtxCreate_v2(void){return 0;} int cuMemcpy(void){return 0;} \
             int cuStreamSynchronize(void){return 0;} int cuMemGetInfo_v2(void){return 0;}",
        );
        let e = verdict(&eight, Cuda).unwrap_err();
        assert!(e.contains("cuDriverGetVersion"), "{e}");
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists())
            .unwrap();
        assert!(verdict(libc, Cuda).is_err());
    }

    #[test]
    fn rejects_non_elf_files() {
        let err = resolve_in(&b"#!/bin/sh\n"[..], Path::new("/x"), ApiId::all()).unwrap_err();
        assert!(matches!(err, ProbeError::NotElf { .. }), "{err}");
    }

    fn configured(path: &Path) -> LibraryFile {
        crate::discovery::configured_library(crate::discovery::LibraryKind::Cuda, path)
            .expect("a regular file")
    }

    /// Read on demand, a library resolves to the same symbols as read whole, reading a small
    /// part of it.
    #[test]
    fn the_bounded_reader_resolves_what_the_whole_file_does() {
        let mut libs = vec![
            ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
                .into_iter()
                .map(std::path::PathBuf::from)
                .find(|p| p.exists())
                .expect("libc.so.6"),
        ];
        for var in ["VGPU_TEST_LIBCUDA", "VGPU_TEST_LIBNCCL"] {
            if let Some(p) = std::env::var_os(var).map(std::path::PathBuf::from)
                && p.exists()
            {
                libs.push(p);
            }
        }
        for path in libs {
            let lib = configured(&path);
            let bounded = resolve(&lib, ApiId::all()).unwrap();
            // Measured: libc 0.3 MB of 1.9 MB, Debian's libcuda 535 0.6 MB of 29 MB, NCCL's
            // wheel 1.1 MB of 398 MB.
            let whole = std::fs::read(&path).unwrap();
            let reference = resolve_in(&*whole, &path, ApiId::all()).unwrap();
            let offsets = |t: &SymbolTable| -> Vec<(ApiId, u64, Prologue)> {
                t.found
                    .iter()
                    .map(|s| (s.api, s.file_offset, s.prologue))
                    .collect()
            };
            assert_eq!(offsets(&bounded), offsets(&reference), "{}", path.display());
            assert_eq!(bounded.missing, reference.missing);
            let file = crate::discovery::open_library(&lib).unwrap();
            let elf = BoundedElf::new(&file).unwrap();
            resolve_in(&elf, &path, ApiId::all()).unwrap();
            assert!(
                elf.used.get() < (8 << 20),
                "{}: read {} bytes of {}",
                path.display(),
                elf.used.get(),
                whole.len()
            );
        }
    }

    /// A tenant's "libcuda" that is a 16 GB sparse file is refused without reading it.
    #[test]
    fn a_sparse_or_endless_library_is_refused_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libcuda.so.1");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(16 << 30)
            .unwrap();
        let t0 = std::time::Instant::now();
        let err = resolve(&configured(&path), ApiId::all()).unwrap_err();
        assert!(matches!(err, ProbeError::NotElf { .. }), "{err}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        // Whatever the parser asks for, the reader stops at the budget.
        let file = crate::discovery::open_library(&configured(&path)).unwrap();
        let elf = BoundedElf::new(&file).unwrap();
        assert!((&elf).read_bytes_at(0, MAX_SYMBOL_BYTES + 1).is_err());
        assert!(elf.over_budget.get());
        let elf = BoundedElf::new(&file).unwrap();
        assert!((&elf).read_bytes_at_until(0..16 << 30, b'x').is_err());
        assert!(elf.used.get() <= MAX_SYMBOL_BYTES);
        assert!(elf.over_budget.get());
    }

    #[test]
    fn reads_across_blocks_and_strings_come_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut bytes: Vec<u8> = (0..3 * BLOCK).map(|i| (i % 251) as u8 + 1).collect();
        let at = BLOCK as usize - 3;
        bytes[at + 10] = 0;
        std::fs::write(&path, &bytes).unwrap();
        let file = crate::discovery::open_library(&configured(&path)).unwrap();
        let elf = BoundedElf::new(&file).unwrap();
        let r = &elf;
        assert_eq!(r.read_bytes_at(at as u64, 8).unwrap(), &bytes[at..at + 8]);
        assert_eq!(r.read_bytes_at(5, 4).unwrap(), &bytes[5..9]);
        assert_eq!(
            r.read_bytes_at_until(at as u64..3 * BLOCK, 0).unwrap(),
            &bytes[at..at + 10]
        );
        assert!(r.read_bytes_at(3 * BLOCK - 2, 4).is_err(), "past the end");
        assert!(
            r.read_bytes_at_until(at as u64 + 11..3 * BLOCK, 0).is_err(),
            "no delimiter"
        );
    }
}
