//! Policy components assembled without a compiler, for the hostile tests
//! whose misbehaviour Rust cannot express: several linear memories or a
//! table grown in `judge`, an enormous amount of code, or a component of
//! the right interface version whose types differ from the real WIT.
//!
//! The core module is encoded here, instruction by instruction; then
//! `wit-component` makes it a component for the given WIT, exactly as
//! `wasm-tools component new` would. The policy itself is minimal:
//! `describe` returns a fixed `policy-info` (name `assembled`, no
//! parameters), `validate` accepts everything, and `judge` grows the extra
//! memories and the table, then answers "not congested".

use wasm_encoder::{
    BlockType, CodeSection, ConstExpr, DataSection, EntityType, ExportKind, ExportSection,
    Function, FunctionSection, GlobalSection, GlobalType, HeapType, ImportSection, MemArg,
    MemorySection, MemoryType, Module, RefType, TableSection, TableType, TypeSection, ValType,
};
use wit_component::{ComponentEncoder, StringEncoding};
use wit_parser::Resolve;

/// What the assembled policy does beyond the minimum.
#[derive(Debug, Clone, Default)]
pub struct Assembled {
    /// Linear memories besides the main one (each starts empty).
    pub extra_memories: u32,
    /// Pages (64 KiB) `judge` grows each extra memory by, and fills (at
    /// most 32767).
    pub judge_grows_pages: u32,
    /// Elements `judge` grows a function table by (none: no table).
    pub judge_grows_table: u32,
    /// Bytes of code never called, to make the component large and slow to
    /// compile (rounded to whole functions of `filler_function_bytes`).
    pub filler_bytes: usize,
    /// Bytes of each filler function: straight-line code (0: 4 KiB).
    pub filler_function_bytes: usize,
    /// Elements of a function table the module starts with (0: none
    /// unless `judge_grows_table`).
    pub initial_table: u64,
    /// Functions never called that do nothing (a few bytes each): many
    /// functions in little code.
    pub empty_functions: u32,
    /// A function of the `host` interface to import (and call from
    /// `judge`), of type `func()`: the WIT given must declare it.
    pub host_import: Option<String>,
    /// The interface `host_import` comes from instead of the policy's
    /// `host` (e.g. `wasi:sockets/tcp@0.2.9`): the WIT given must declare
    /// it and import it into the world.
    pub import_interface: Option<String>,
}

/// Where the fixed answers live in the main memory.
const INFO_AREA: i32 = 1024;
/// Zero bytes: `ok` of `result<_, string>` and `ok(verdict { congested:
/// false, reasons: [] })` of `result<verdict, string>`.
const ZERO_AREA: i32 = 2048;
/// Where `cabi_realloc` starts handing out memory (the host copies the
/// arguments of `validate` and `judge` there).
const HEAP_START: i32 = 4096;

/// The component for `wit` (a `nyann:policy` package text, world
/// `congestion-policy`), whose `policy` interface has the version `version`
/// (`0.2.0`).
pub fn component(wit: &str, version: &str, spec: &Assembled) -> Result<Vec<u8>, String> {
    let mut resolve = Resolve::default();
    let package = resolve
        .push_source("policy.wit", wit)
        .map_err(|e| format!("the WIT does not parse: {e:#}"))?;
    let world = resolve
        .select_world(&[package], Some("congestion-policy"))
        .map_err(|e| format!("the WIT has no congestion-policy world: {e:#}"))?;
    let mut module = core_module(&format!("nyann:policy/policy@{version}"), spec);
    wit_component::embed_component_metadata(&mut module, &resolve, world, StringEncoding::UTF8)
        .map_err(|e| format!("cannot embed the WIT: {e:#}"))?;
    ComponentEncoder::default()
        .module(&module)
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|e| format!("cannot make a component: {e:#}"))
}

/// The core module: exports `memory`, `cabi_realloc` and the three
/// functions of `interface`, named as the canonical ABI expects.
fn core_module(interface: &str, spec: &Assembled) -> Vec<u8> {
    let mut types = TypeSection::new();
    let i32s = |n: usize| vec![ValType::I32; n];
    types.ty().function(i32s(4), i32s(1)); // 0: cabi_realloc
    types.ty().function([], i32s(1)); // 1: describe (returns a pointer)
    types.ty().function(i32s(2), i32s(1)); // 2: validate(list) -> pointer
    types.ty().function(i32s(1), i32s(1)); // 3: judge(pointer to args) -> pointer
    types.ty().function(i32s(1), i32s(1)); // 4: filler

    types.ty().function([], []); // 5: an empty function, the host import

    // The host import comes first: defined functions start after it.
    let mut imports = ImportSection::new();
    let host = spec
        .import_interface
        .clone()
        .unwrap_or_else(|| interface.replace("/policy@", "/host@"));
    if let Some(name) = &spec.host_import {
        imports.import(&host, name, EntityType::Function(5));
    }
    let base = u32::from(spec.host_import.is_some());

    let filler_size = match spec.filler_function_bytes {
        0 => FILLER_BYTES,
        n => n,
    };
    let filler_functions = spec.filler_bytes.div_ceil(filler_size) as u32;
    let mut functions = FunctionSection::new();
    for ty in [0, 1, 2, 3] {
        functions.function(ty);
    }
    for _ in 0..filler_functions {
        functions.function(4);
    }
    for _ in 0..spec.empty_functions {
        functions.function(5);
    }

    let mut memories = MemorySection::new();
    for index in 0..=spec.extra_memories {
        memories.memory(MemoryType {
            minimum: u64::from(index == 0),
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
    }

    let mut tables = TableSection::new();
    if spec.judge_grows_table > 0 || spec.initial_table > 0 {
        tables.table(TableType {
            element_type: RefType::FUNCREF,
            table64: false,
            minimum: spec.initial_table,
            maximum: None,
            shared: false,
        });
    }

    let mut globals = GlobalSection::new();
    globals.global(
        GlobalType {
            val_type: ValType::I32,
            mutable: true,
            shared: false,
        },
        &ConstExpr::i32_const(HEAP_START),
    );

    let mut exports = ExportSection::new();
    exports.export("memory", ExportKind::Memory, 0);
    exports.export("cabi_realloc", ExportKind::Func, base);
    exports.export(&format!("{interface}#describe"), ExportKind::Func, base + 1);
    exports.export(&format!("{interface}#validate"), ExportKind::Func, base + 2);
    exports.export(&format!("{interface}#judge"), ExportKind::Func, base + 3);

    let mut code = CodeSection::new();
    code.function(&realloc());
    code.function(&returns(INFO_AREA));
    code.function(&returns(ZERO_AREA));
    code.function(&judge(spec));
    let filler = filler(filler_size);
    for _ in 0..filler_functions {
        code.function(&filler);
    }
    let mut empty = Function::new([]);
    empty.instructions().end();
    for _ in 0..spec.empty_functions {
        code.function(&empty);
    }

    let mut data = DataSection::new();
    data.active(0, &ConstExpr::i32_const(INFO_AREA), policy_info());

    let mut module = Module::new();
    module.section(&types);
    if !imports.is_empty() {
        module.section(&imports);
    }
    module
        .section(&functions)
        .section(&tables)
        .section(&memories)
        .section(&globals)
        .section(&exports)
        .section(&code)
        .section(&data);
    module.finish()
}

/// `cabi_realloc(old, old_size, align, size)`: a bump allocator over the
/// main memory, growing it as needed (the host only ever allocates).
fn realloc() -> Function {
    let mut f = Function::new([(1, ValType::I32)]);
    let (align, size, start) = (2, 3, 4);
    f.instructions()
        // start = (heap + align - 1) & -align
        .global_get(0)
        .local_get(align)
        .i32_add()
        .i32_const(1)
        .i32_sub()
        .i32_const(0)
        .local_get(align)
        .i32_sub()
        .i32_and()
        .local_tee(start)
        // heap = start + size
        .local_get(size)
        .i32_add()
        .global_set(0)
        // Grow to ceil(heap / 64 KiB) pages when short; trap if refused.
        .global_get(0)
        .i32_const(0xFFFF)
        .i32_add()
        .i32_const(16)
        .i32_shr_u()
        .memory_size(0)
        .i32_sub()
        .local_tee(size)
        .i32_const(0)
        .i32_gt_s()
        .if_(BlockType::Empty)
        .local_get(size)
        .memory_grow(0)
        .i32_const(-1)
        .i32_eq()
        .if_(BlockType::Empty)
        .unreachable()
        .end()
        .end()
        .local_get(start)
        .end();
    f
}

/// A function returning a fixed pointer (ignoring its arguments).
fn returns(pointer: i32) -> Function {
    let mut f = Function::new([]);
    f.instructions().i32_const(pointer).end();
    f
}

/// `judge`: grow every extra memory and write to all of the new bytes (so
/// that they are really used, not just reserved), grow the table, then
/// answer "not congested".
fn judge(spec: &Assembled) -> Function {
    let mut f = Function::new([]);
    let mut sink = f.instructions();
    let pages = i32::try_from(spec.judge_grows_pages.min(0x7FFF)).unwrap_or(0);
    for memory in 1..=spec.extra_memories {
        // memory.fill(old size in bytes, 1, grown bytes); a refused grow
        // (-1) makes the fill trap.
        sink.i32_const(pages)
            .memory_grow(memory)
            .i32_const(16)
            .i32_shl()
            .i32_const(1)
            .i32_const(pages << 16)
            .memory_fill(memory);
    }
    if spec.judge_grows_table > 0 {
        // table.grow returns -1 when refused: trap then.
        let elements = i32::try_from(spec.judge_grows_table).unwrap_or(i32::MAX);
        sink.ref_null(HeapType::FUNC)
            .i32_const(elements)
            .table_grow(0)
            .i32_const(-1)
            .i32_eq()
            .if_(BlockType::Empty)
            .unreachable()
            .end();
    }
    if spec.host_import.is_some() {
        sink.call(0);
    }
    sink.i32_const(ZERO_AREA).end();
    f
}

/// Bytes of code in one filler function.
const FILLER_BYTES: usize = 4 << 10;

/// Code that is never called: `mem[x + k] += x` over and over (memory
/// traffic the compiler cannot fold away, like ordinary code).
fn filler(bytes: usize) -> Function {
    let mut f = Function::new([]);
    let mut sink = f.instructions();
    let at = |k: usize| MemArg {
        offset: (k * 4 % 60_000) as u64,
        align: 2,
        memory_index: 0,
    };
    // Each step is about 12 bytes.
    for k in 0..bytes / 12 {
        sink.local_get(0)
            .local_get(0)
            .i32_load(at(k))
            .local_get(0)
            .i32_add()
            .i32_store(at(k));
    }
    sink.local_get(0).end();
    f
}

/// The `policy-info` record at [`INFO_AREA`] (the same layout in 0.1 and
/// 0.2): four (pointer, length) pairs, then the strings they point at.
fn policy_info() -> Vec<u8> {
    let strings: [&[u8]; 3] = [
        b"assembled",
        b"0.0.0",
        b"Assembled without a compiler; never congested.",
    ];
    let mut record = Vec::new();
    let mut text = Vec::new();
    let text_start = INFO_AREA as u32 + 32;
    for s in strings {
        record.extend((text_start + text.len() as u32).to_le_bytes());
        record.extend((s.len() as u32).to_le_bytes());
        text.extend_from_slice(s);
    }
    // params: an empty list.
    record.extend(0u32.to_le_bytes());
    record.extend(0u32.to_le_bytes());
    record.extend(text);
    record
}
