//! Shared harness of the C-tool tests (ffi/tests/c_tool_*.rs): builds a C tool of
//! tests/c_probe_tools, runs a scenario in a child process of its own (kreplay's state is process-wide),
//! loads this build's libkreplay.so as ROCm does with HSA_TOOLS_LIB, calls its OnLoad with a
//! copy of softhsa's table, runs an ordinary HSA application through it (in-place `x += 1`
//! dispatches, checked against single-run results) and then asks the tool what it saw.
#![allow(dead_code)]

use std::ffi::{CStr, c_char};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hsa_sys::HsaApiTable;
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};

pub const CHILD_ENV: &str = "KREPLAY_PROBE_C_CHILD";
pub const ELEMENTS: usize = 1024;

/// Builds tests/c_probe_tools/`source` into a shared library (C11, warnings as errors).
pub fn build_tool(source: &str, test: &str) -> PathBuf {
    assert!(super::common::have_compiler("cc"), "these tests need `cc`");
    let dir = super::common::scratch_dir(test);
    let out = dir.join(format!("lib{}.so", source.trim_end_matches(".c")));
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("c_probe_tools")
        .join(source);
    super::common::build_atomically(&out, |partial| {
        let args: Vec<std::ffi::OsString> = vec![
            "-std=c11".into(),
            "-D_GNU_SOURCE".into(),
            "-Wall".into(),
            "-Wextra".into(),
            "-Werror".into(),
            "-fPIC".into(),
            "-shared".into(),
            "-pthread".into(),
            "-I".into(),
            super::common::include_dir().into(),
            src.into(),
            "-o".into(),
            partial.into(),
            "-lpthread".into(),
        ];
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        super::common::run_ok("cc", &refs);
    });
    out
}

/// What the child printed and how it ended.
pub struct ChildRun {
    pub status: Option<i32>,
    pub hung: bool,
    pub stdout: String,
    pub stderr: String,
}

impl ChildRun {
    pub fn report(&self) -> String {
        format!(
            "exit {:?}, hung {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.hung, self.stdout, self.stderr
        )
    }
}

/// Runs test `name` of this binary in a child process with `env`, killed after `deadline`.
pub fn child(name: &str, env: &[(&str, &std::ffi::OsStr)], deadline: Duration) -> ChildRun {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("child starts");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let mut hung = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > deadline {
            hung = true;
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    ChildRun {
        status: status.code(),
        hung,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

/// Is this process the child running test `name`?
pub fn in_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(name)
}

#[derive(Clone, Copy)]
#[repr(C)]
pub struct AddOneArgs {
    pub data: *mut u32,
    pub len: u32,
}

pub fn add_one(group: &WorkGroup) {
    // SAFETY: the application passes an `AddOneArgs` kernarg block.
    let args: AddOneArgs = unsafe { group.kernargs() };
    for [x, _, _] in group.work_items() {
        if x < args.len {
            // SAFETY: `data` holds `len` u32 in live device memory; each work-item owns one.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

type OnLoadFn = unsafe extern "C" fn(*mut HsaApiTable, u64, u64, *const *const c_char) -> bool;
type OnUnloadFn = unsafe extern "C" fn();

/// libkreplay.so loaded as a runtime loads HSA_TOOLS_LIB, with OnLoad called on `table`.
pub struct Loaded {
    pub library: libloading::os::unix::Library,
    pub on_unload: OnUnloadFn,
    pub loaded: bool,
}

/// Loads libkreplay.so (RTLD_GLOBAL, as softhsa_app does) and calls OnLoad.
pub fn load_kreplay(table: &mut OwnedApiTable) -> Loaded {
    // SAFETY: libkreplay.so's initializers do nothing special.
    // PROBE_LOAD_LOCAL=1: as ROCm's runtime opens HSA_TOOLS_LIB (dlopen(path, RTLD_LAZY), its
    // symbols not global); else as softhsa_app does (RTLD_NOW | RTLD_GLOBAL).
    let flags = if std::env::var_os("PROBE_LOAD_LOCAL").is_some() {
        libloading::os::unix::RTLD_LAZY | libloading::os::unix::RTLD_LOCAL
    } else {
        libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL
    };
    // SAFETY: this build's libkreplay, whose initializers are kreplay's own.
    let library =
        unsafe { libloading::os::unix::Library::open(Some(super::common::libkreplay()), flags) }
            .expect("load libkreplay.so");
    // SAFETY: exported with these signatures.
    let (on_load, on_unload) = unsafe {
        (
            *library.get::<OnLoadFn>(b"OnLoad\0").unwrap(),
            *library.get::<OnUnloadFn>(b"OnUnload\0").unwrap(),
        )
    };
    // SAFETY: the table is valid and outlives every call through it.
    let loaded = unsafe { on_load(table.as_mut_ptr(), 1, 0, std::ptr::null()) };
    Loaded {
        library,
        on_unload,
        loaded,
    }
}

/// The application: `buffers` buffers on GPU agent `agent_index`, `rounds` in-place `x += 1`
/// dispatches over each; returns the problems found in its results (empty when they equal a
/// single run's).
pub struct App<'a> {
    pub hsa: &'a Hsa,
    pub agent: hsa_sys::hsa_agent_t,
    pub queue: *mut hsa_sys::hsa_queue_t,
    pub kernel: u64,
    pub kernarg_pool: hsa_sys::hsa_amd_memory_pool_t,
    pub buffers: Vec<(*mut u32, Vec<u32>)>,
    pub rounds_done: u32,
}

impl<'a> App<'a> {
    pub fn new(hsa: &'a Hsa, agent_index: usize, buffers: usize) -> App<'a> {
        let agent = hsa.gpu_agents().expect("agents")[agent_index];
        let pool = hsa.coarse_pool(agent).expect("coarse pool");
        let kernarg_pool = hsa.pool(agent, PoolKind::Kernarg).expect("kernarg pool");
        let kernel = register_kernel("probe_c_add_one", add_one);
        let queue = hsa.queue_create(agent, 64).expect("queue");
        let mut list = Vec::new();
        for b in 0..buffers {
            let ptr = hsa
                .allocate(pool, ELEMENTS * 4)
                .expect("buffer")
                .cast::<u32>();
            let init: Vec<u32> = (0..ELEMENTS as u32).map(|i| i * 5 + b as u32).collect();
            // SAFETY: softhsa device memory is host memory; ELEMENTS u32.
            unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), ptr, ELEMENTS) };
            list.push((ptr, init));
        }
        App {
            hsa,
            agent,
            queue,
            kernel,
            kernarg_pool,
            buffers: list,
            rounds_done: 0,
        }
    }

    /// One dispatch over buffer `b`; returns whether its completion fired exactly once.
    pub fn dispatch(&self, b: usize) -> Result<(), String> {
        let args = self
            .hsa
            .allocate(self.kernarg_pool, std::mem::size_of::<AddOneArgs>())
            .expect("kernargs")
            .cast::<AddOneArgs>();
        // SAFETY: the kernarg allocation holds one AddOneArgs.
        unsafe {
            args.write(AddOneArgs {
                data: self.buffers[b].0,
                len: ELEMENTS as u32,
            })
        };
        let done = self.hsa.signal_create(1).expect("signal");
        // SAFETY: live queue, registered kernel, valid kernargs.
        unsafe {
            self.hsa.dispatch(
                self.queue,
                &Dispatch::linear(self.kernel, ELEMENTS as u32, 64, args.cast(), done),
            )
        };
        if !self.hsa.wait_zero(done, Duration::from_secs(20)) {
            return Err(format!(
                "buffer {b}: the completion did not fire within 20 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
        let v = self.hsa.signal_load(done);
        self.hsa.signal_destroy(done).ok();
        if v != 0 {
            return Err(format!("buffer {b}: completion signal is {v}, not 0"));
        }
        Ok(())
    }

    /// One dispatch over every buffer.
    pub fn round(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        for b in 0..self.buffers.len() {
            if let Err(e) = self.dispatch(b) {
                problems.push(e);
            }
        }
        self.rounds_done += 1;
        problems
    }

    /// Every buffer must equal its initial value plus the rounds run.
    pub fn check(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (b, (ptr, init)) in self.buffers.iter().enumerate() {
            // SAFETY: every dispatch completed.
            let now = unsafe { std::slice::from_raw_parts(*ptr, ELEMENTS) };
            if let Some(i) = now
                .iter()
                .zip(init)
                .position(|(n, i)| *n != i + self.rounds_done)
            {
                problems.push(format!(
                    "buffer {b} element {i} is {} (initial {}, {} round(s): want {})",
                    now[i],
                    init[i],
                    self.rounds_done,
                    init[i] + self.rounds_done
                ));
            }
        }
        problems
    }
}

/// Calls the tool's `const char* probe_report(void)` (what its own checks found; "" when fine).
pub fn tool_report(tool: &Path) -> String {
    // SAFETY: the tool library is already loaded by kreplay; `probe_report` has this signature.
    let lib = unsafe { libloading::Library::new(tool) }.expect("tool library");
    // SAFETY: as above.
    unsafe {
        let f = lib
            .get::<unsafe extern "C" fn() -> *const c_char>(b"probe_report\0")
            .expect("probe_report exported");
        CStr::from_ptr(f()).to_string_lossy().into_owned()
    }
}

/// The usual child body: kreplay loaded, `rounds` rounds over `buffers` buffers on GPU agent 0,
/// results checked, OnUnload, then every tool's `probe_report`. Prints `TOOL-PROBLEM: ...` lines
/// and `PROBE-DONE` at the end.
pub fn standard_child(buffers: usize, rounds: u32) {
    let mut table = OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let mut problems = Vec::new();
    if !loaded.loaded {
        problems.push("OnLoad returned false".to_string());
    }
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        let mut app = App::new(&hsa, 0, buffers);
        for _ in 0..rounds {
            problems.extend(app.round());
        }
        problems.extend(app.check());
        drop(session);
    }
    // SAFETY: the runtime's shutdown call.
    unsafe { (loaded.on_unload)() };
    for tool in std::env::var("KREPLAY_TOOL_LIBRARIES")
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
    {
        let r = tool_report(Path::new(tool));
        if !r.is_empty() {
            problems.push(format!(
                "tool {}: {r}",
                Path::new(tool).file_name().unwrap().to_string_lossy()
            ));
        }
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

/// Runs `name` in a child with the tools of `sources` (built for this test) and `env`, and
/// returns the problems it reported (a hang, a crash or a missing end are problems too).
pub fn run_scenario(
    name: &str,
    sources: &[&str],
    env: &[(&str, &str)],
    deadline: Duration,
) -> (Vec<String>, ChildRun) {
    let tools: Vec<PathBuf> = sources.iter().map(|s| build_tool(s, name)).collect();
    run_tools(name, &tools, env, deadline)
}

/// [`run_scenario`] with tool libraries already built.
pub fn run_tools(
    name: &str,
    tools: &[PathBuf],
    env: &[(&str, &str)],
    deadline: Duration,
) -> (Vec<String>, ChildRun) {
    let list = std::env::join_paths(tools.iter()).unwrap();
    let mut all: Vec<(&str, &std::ffi::OsStr)> = vec![("KREPLAY_TOOL_LIBRARIES", list.as_os_str())];
    for (k, v) in env {
        all.push((k, std::ffi::OsStr::new(v)));
    }
    let run = child(name, &all, deadline);
    let mut problems: Vec<String> = run
        .stdout
        .lines()
        .filter_map(|l| l.split_once("TOOL-PROBLEM: ").map(|(_, p)| p.to_string()))
        .collect();
    if run.hung {
        problems.push(format!("the child hung (killed after {deadline:?})"));
    } else if run.status != Some(0) {
        problems.push(format!("the child exited with {:?}", run.status));
    } else if !run.stdout.contains("PROBE-DONE") {
        problems.push("the child did not finish its body".into());
    }
    (problems, run)
}

/// What a tool may use to submit GPU work of its own, as a ROCm tool would call the HSA runtime:
/// through the same (kreplay-wrapped) table the application uses.
pub struct ToolGpu {
    pub hsa: Hsa,
    pub queues: Vec<(u64, usize)>, // (agent handle, queue address)
    pub pools: Vec<(
        u64,
        hsa_sys::hsa_amd_memory_pool_t,
        hsa_sys::hsa_amd_memory_pool_t,
    )>,
    pub kernel: u64,
}

// SAFETY: the table and queues are valid for the whole child process; HSA calls are thread-safe.
unsafe impl Send for ToolGpu {}
// SAFETY: as above.
unsafe impl Sync for ToolGpu {}

pub static TOOL_GPU: std::sync::OnceLock<ToolGpu> = std::sync::OnceLock::new();

/// The tool's own kernel (distinct kernel object, so the tool can tell its work from the
/// application's): adds one to one word.
pub fn tool_kernel(group: &WorkGroup) {
    // SAFETY: the tool passes an `AddOneArgs` kernarg block.
    let args: AddOneArgs = unsafe { group.kernargs() };
    for [x, _, _] in group.work_items() {
        if x < args.len {
            // SAFETY: as in add_one.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

/// Creates a queue per GPU agent for the tool and hands `harness_submit_and_wait` to the tool
/// through its `probe_set_submit` (if it exports one).
pub fn give_tool_gpu(table: &OwnedApiTable, tool: &Path) {
    // SAFETY: the table outlives the child's work.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let kernel = register_kernel("probe_c_tool_kernel", tool_kernel);
    let mut queues = Vec::new();
    let mut pools = Vec::new();
    for agent in hsa.gpu_agents().expect("agents") {
        let q = hsa.queue_create(agent, 64).expect("tool queue");
        queues.push((agent.handle, q as usize));
        pools.push((
            agent.handle,
            hsa.coarse_pool(agent).unwrap(),
            hsa.pool(agent, PoolKind::Kernarg).unwrap(),
        ));
    }
    let _ = TOOL_GPU.set(ToolGpu {
        hsa,
        queues,
        pools,
        kernel,
    });
    // SAFETY: the tool is loaded; `probe_set_submit` takes this function pointer.
    let lib = unsafe { libloading::Library::new(tool) }.expect("tool library");
    type SubmitFn = extern "C" fn(u64, u32) -> i32;
    if let Ok(set) =
        // SAFETY: as above.
        unsafe { lib.get::<unsafe extern "C" fn(SubmitFn, u64)>(b"probe_set_submit\0") }
    {
        // SAFETY: as above.
        unsafe { set(harness_submit_and_wait, kernel) };
    }
}

/// Submits one dispatch of the tool's kernel on `agent`'s tool queue and waits up to
/// `timeout_ms` for its completion: 0 when it completed, 1 when it did not in time, 2 on error.
pub extern "C" fn harness_submit_and_wait(agent: u64, timeout_ms: u32) -> i32 {
    let Some(gpu) = TOOL_GPU.get() else { return 2 };
    let Some(&(_, q)) = gpu.queues.iter().find(|(a, _)| *a == agent) else {
        return 2;
    };
    let Some(&(_, pool, kpool)) = gpu.pools.iter().find(|(a, _, _)| *a == agent) else {
        return 2;
    };
    let hsa = &gpu.hsa;
    let Ok(buf) = hsa.allocate(pool, 64) else {
        return 2;
    };
    let Ok(args) = hsa.allocate(kpool, std::mem::size_of::<AddOneArgs>()) else {
        return 2;
    };
    // SAFETY: the allocations are live and large enough.
    unsafe {
        std::ptr::write_bytes(buf, 0, 64);
        args.cast::<AddOneArgs>().write(AddOneArgs {
            data: buf.cast(),
            len: 16,
        });
    }
    let Ok(done) = hsa.signal_create(1) else {
        return 2;
    };
    // SAFETY: the queue is live, the kernel registered, the kernargs valid.
    unsafe {
        hsa.dispatch(
            q as *mut hsa_sys::hsa_queue_t,
            &Dispatch::linear(gpu.kernel, 16, 16, args.cast(), done),
        )
    };
    let ok = hsa.wait_zero(done, Duration::from_millis(u64::from(timeout_ms)));
    if ok {
        // Leaked on timeout: the dispatch may still complete later.
        hsa.signal_destroy(done).ok();
    }
    if ok { 0 } else { 1 }
}

/// Like [`standard_child`], with the GPU hook given to the first tool before the application
/// runs and `agents` application queues (agent i runs over its own buffers).
pub fn standard_child_with_gpu(buffers: usize, rounds: u32) {
    let mut table = OwnedApiTable::softhsa();
    let loaded = load_kreplay(&mut table);
    let mut problems = Vec::new();
    if !loaded.loaded {
        problems.push("OnLoad returned false".to_string());
    }
    let tools: Vec<String> = std::env::var("KREPLAY_TOOL_LIBRARIES")
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    {
        // SAFETY: the table stays alive and valid while `hsa` is used.
        let hsa = unsafe { Hsa::from_table(table.table()) };
        let session = hsa.init().expect("hsa_init");
        give_tool_gpu(&table, Path::new(&tools[0]));
        let mut app = App::new(&hsa, 0, buffers);
        for _ in 0..rounds {
            problems.extend(app.round());
        }
        problems.extend(app.check());
        std::mem::forget(session);
    }
    // SAFETY: the runtime's shutdown call.
    unsafe { (loaded.on_unload)() };
    for tool in &tools {
        let r = tool_report(Path::new(tool));
        if !r.is_empty() {
            problems.push(format!(
                "tool {}: {r}",
                Path::new(tool).file_name().unwrap().to_string_lossy()
            ));
        }
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

/// Two runtime sessions, as an application that calls hsa_init / hsa_shut_down twice gets on
/// ROCm: each session's runtime hands OnLoad a fresh table and calls OnUnload at its end.
/// Prints what each session's OnLoad returned and the tool's replay count after each.
pub fn two_sessions_child(buffers: usize, rounds: u32) {
    let mut problems = Vec::new();
    let tool = std::env::var("KREPLAY_TOOL_LIBRARIES").unwrap();
    for session_no in 1..=2 {
        let mut table = OwnedApiTable::softhsa();
        let loaded = load_kreplay(&mut table);
        if !loaded.loaded {
            problems.push(format!("session {session_no}: OnLoad returned false"));
        }
        {
            // SAFETY: the table stays alive and valid while `hsa` is used.
            let hsa = unsafe { Hsa::from_table(table.table()) };
            let session = hsa.init().expect("hsa_init");
            let mut app = App::new(&hsa, 0, buffers);
            for _ in 0..rounds {
                problems.extend(app.round());
            }
            problems.extend(
                app.check()
                    .into_iter()
                    .map(|p| format!("session {session_no}: {p}")),
            );
            drop(session);
        }
        // SAFETY: the runtime's shutdown call.
        unsafe { (loaded.on_unload)() };
        let r = tool_report(Path::new(&tool));
        if !r.is_empty() {
            problems.push(format!("after session {session_no}: {r}"));
        }
    }
    for p in &problems {
        println!("TOOL-PROBLEM: {p}");
    }
    println!("PROBE-DONE");
}

// SAFETY: the queue and buffers are plain device addresses valid for the child's lifetime; HSA
// calls are thread-safe; each App is used by one thread at a time.
unsafe impl Send for App<'_> {}
