//! Running the program of `kreplay run` as a child process: its standard input given to both
//! runs of `--check` alike, its standard output captured without waiting for processes it left
//! running, and interruptions (SIGINT, SIGTERM, SIGHUP) passed on to it, so that `kreplay run`
//! cleans up after itself instead of dying first (SIGQUIT, SIGUSR1 and SIGUSR2 too, which
//! interrupt nothing: the program decides). One sent to kreplay's whole process group
//! (Ctrl-C or a hangup from the terminal, `kill -INT -PGID`, a job runner stopping the group)
//! reached the program too when it is in that group: it is not passed on again, so the program
//! gets each such signal once, as it would without kreplay (a program that force-quits on a
//! second SIGINT would skip its cleanup). A signal sent to kreplay's process alone cannot be
//! told from one sent to its group by kreplay itself, so a second process of the group, the
//! witness, which holds the signals pending, is asked whether it got the signal too.

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// The program's process while it runs (0: none): where an interruption is passed on.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The latest program's process id, kept after it was waited for (0: none yet): a signal it
/// sent may be handled after that.
static PROGRAM: AtomicI32 = AtomicI32::new(0);
/// The signal that interrupted `kreplay run` (0: none).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);
/// Whether the latest interruption was sent to kreplay's whole process group.
static TO_GROUP: AtomicBool = AtomicBool::new(false);
/// kreplay's end of the socket to the witness (-1: none), see [`start_witness`].
static WITNESS: AtomicI32 = AtomicI32::new(-1);
/// The witness's process id (0: none).
static WITNESS_PID: AtomicI32 = AtomicI32::new(0);
/// A handler is asking the witness (handlers on two threads take turns).
static ASKING: AtomicBool = AtomicBool::new(false);
/// The number of the latest question to the witness, which its answer repeats.
static QUESTION: AtomicU8 = AtomicU8::new(0);

/// The program is being started: [`CHILD`] is not set yet.
static SPAWNING: AtomicBool = AtomicBool::new(false);
/// Signals that came while the program was being started, to be passed on to it (bit `i`:
/// `PASSED_ON[i]`).
static PENDING: AtomicU32 = AtomicU32::new(0);

/// SIGCHLD was ignored when `kreplay run` started (see [`prepare`]).
static SIGCHLD_IGNORED: AtomicBool = AtomicBool::new(false);

/// The signals `kreplay run` passes on: the ones that interrupt it, and the ones that do not
/// ([`interrupts`]), though their default action would end kreplay: SIGQUIT (a program may
/// survive it: a JVM prints its threads and runs on) and SIGUSR1 and SIGUSR2 (a job runner's
/// warning that its time is nearly up, a launcher notifying the workers of its process group).
const PASSED_ON: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Whether `signal`, passed on to the program, interrupts `kreplay run` (the run then fails):
/// one that asks the program to stop.
fn interrupts(signal: libc::c_int) -> bool {
    matches!(signal, libc::SIGINT | libc::SIGTERM | libc::SIGHUP)
}
/// How long a handler waits for the witness's answer before it passes the signal on anyway:
/// the witness answers at once unless it is not running (a loaded machine, someone stopped
/// it), and a "no" taken too early passes a group's signal on a second time.
const WITNESS_ANSWER_MS: i64 = 10_000;

/// How long, after the program exited, the rest of its standard output may take to arrive and
/// the processes it leaves behind may take to end: what it wrote is in the pipe already, so
/// only a process it left running and holding the pipe can make the output take longer, and
/// helpers that end when the program does (Python's multiprocessing resource tracker and fork
/// server end once its end closes their pipe, after cleaning up) need a moment too.
const AFTER_EXIT: Duration = Duration::from_secs(2);
/// How often the processes left behind are looked at while they are waited for.
const REAP_EVERY: Duration = Duration::from_millis(10);

extern "C" fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: errno is this thread's; the code the signal interrupted finds it as it was.
    let saved_errno = unsafe { *libc::__errno_location() };
    // A signal the terminal's driver sent (Ctrl-C, a hangup) comes from the kernel, to the
    // foreground process group; one a process sent with kill comes from that process
    // (SI_USER), to kreplay alone or to its group: the witness says which. It is asked every
    // time, so that it holds no signal from an earlier one.
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t (checked for null anyway).
    let from_terminal = !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL;
    let to_group = witness_got(signal) || from_terminal;
    // SAFETY: as above; si_pid is the sender's for a signal a process sent (SI_USER).
    let sender = unsafe {
        if !info.is_null() && (*info).si_code == libc::SI_USER {
            (*info).si_pid()
        } else {
            0
        }
    };
    if to_group && sender > 0 && from_the_program(sender) {
        // The program (or a process it started) signalled its own process group, which is
        // kreplay's: without kreplay the signal stays in the program's group (a launcher
        // ending its helpers with `kill 0`). It interrupts nothing, and the program's group
        // got it already.
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = saved_errno };
        return;
    }
    if interrupts(signal) {
        // Both describe the latest interruption (a SIGTERM from a job runner after a Ctrl-C
        // is still passed on to the processes the program left behind).
        TO_GROUP.store(to_group, Ordering::SeqCst);
        INTERRUPTED.store(signal, Ordering::SeqCst);
    }
    let child = CHILD.load(Ordering::SeqCst);
    if child == 0 && !to_group && SPAWNING.load(Ordering::SeqCst) {
        // The program is starting, its process id not known yet: a program quick to signal
        // kreplay (or a signal that came just then) would lose it. It is passed on once the id
        // is ([`pass_on_pending`]), by whichever of this handler and the spawning thread
        // clears its bit.
        if let Some(index) = PASSED_ON.iter().position(|&s| s == signal) {
            let bit = 1u32 << index;
            PENDING.fetch_or(bit, Ordering::SeqCst);
            let child = CHILD.load(Ordering::SeqCst);
            if child > 0 && PENDING.fetch_and(!bit, Ordering::SeqCst) & bit != 0 {
                // SAFETY: kill is async-signal-safe; the pid is the program's (see below).
                unsafe { libc::kill(child, signal) };
            }
        }
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = saved_errno };
        return;
    }
    if child > 0 && !(to_group && in_our_group(child)) {
        // SAFETY: kill is async-signal-safe; the pid is the program's, set only while it runs
        // (cleared as soon as it was waited for).
        unsafe { libc::kill(child, signal) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved_errno };
}

/// Whether process `pid` is the program or one of its descendants (orphans this process
/// adopted included): its parents, read from `/proc/<pid>/stat`, lead to the program or to
/// this process. A descendant that already ended and was reaped cannot be told from any
/// other process: `false`. Only async-signal-safe calls: it runs in the signal handler.
fn from_the_program(mut pid: libc::pid_t) -> bool {
    // SAFETY: getpid has no arguments.
    let me = unsafe { libc::getpid() };
    let program = PROGRAM.load(Ordering::SeqCst);
    // A chain longer than this is taken for one that does not lead here.
    for _ in 0..64 {
        if pid == program && program > 0 {
            return true;
        }
        if pid == me {
            return true;
        }
        if pid <= 1 {
            return false;
        }
        match parent_of(pid) {
            Some(parent) => pid = parent,
            None => return false,
        }
    }
    false
}

/// The parent of process `pid`, from `/proc/<pid>/stat`, without allocating (it runs in the
/// signal handler).
fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    // "/proc/" + up to 10 digits + "/stat" + NUL.
    let mut path = [0u8; 32];
    let mut at = 0;
    for &b in b"/proc/" {
        path[at] = b;
        at += 1;
    }
    let mut digits = [0u8; 10];
    let (mut n, mut count) = (pid as u32, 0);
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in (0..count).rev() {
        path[at] = digits[i];
        at += 1;
    }
    for &b in b"/stat" {
        path[at] = b;
        at += 1;
    }
    let mut buf = [0u8; 512];
    // SAFETY: the path is NUL-terminated (the array was zeroed and is longer than what was
    // written); read fills at most the buffer's length; the descriptor is closed.
    let read = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let read = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        read
    };
    let text = buf.get(..usize::try_from(read).ok()?)?;
    // The fourth field, after the command name in parentheses (which may hold any byte).
    let close = text.iter().rposition(|&b| b == b')')?;
    let mut fields = text[close + 1..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty());
    let parent = fields.nth(1)?;
    let mut value: libc::pid_t = 0;
    for &b in parent {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value
            .checked_mul(10)?
            .checked_add(libc::pid_t::from(b - b'0'))?;
    }
    Some(value)
}

/// Whether the witness got `signal` too (and takes it): it was sent to kreplay's process
/// group. Without a witness, or one that does not answer in time, `false`. Only
/// async-signal-safe calls: it runs in the signal handler.
fn witness_got(signal: libc::c_int) -> bool {
    let Some(bit) = PASSED_ON.iter().position(|&s| s == signal) else {
        return false;
    };
    while ASKING
        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // SAFETY: sched_yield has no arguments.
        unsafe { libc::sched_yield() };
    }
    // Read with the turn held: [`end_witness`] closes it only with the turn.
    let socket = WITNESS.load(Ordering::SeqCst);
    let got = socket >= 0 && ask_witness(socket, bit as u8);
    ASKING.store(false, Ordering::SeqCst);
    got
}

/// Asks the witness on `socket` whether it holds the signal `PASSED_ON[index]` (taking it);
/// `false` when it does not answer in time. Only that signal is taken: another one it holds
/// is another handler's to ask about.
fn ask_witness(socket: libc::c_int, index: u8) -> bool {
    let number = QUESTION.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
    let question = [number, index];
    // SAFETY: two bytes from a live local; MSG_NOSIGNAL: a witness that ended gives EPIPE,
    // not SIGPIPE.
    if unsafe { libc::send(socket, question.as_ptr().cast(), 2, libc::MSG_NOSIGNAL) } != 2 {
        return false;
    }
    let deadline = monotonic_ms().saturating_add(WITNESS_ANSWER_MS);
    loop {
        let mut ready = libc::pollfd {
            fd: socket,
            events: libc::POLLIN,
            revents: 0,
        };
        let left = deadline
            .saturating_sub(monotonic_ms())
            .clamp(0, i64::from(i32::MAX));
        // SAFETY: one pollfd, live for the call.
        let polled = unsafe { libc::poll(&mut ready, 1, left as libc::c_int) };
        // SAFETY: errno is this thread's, read right after the call.
        if polled < 0 && unsafe { *libc::__errno_location() } == libc::EINTR && left > 0 {
            // Another signal was handled meanwhile (SIGCHLD when the witness or the program
            // stopped or went on): the answer is still due.
            continue;
        }
        if polled != 1 {
            return false;
        }
        let mut answer = [0u8; 2];
        // SAFETY: reads at most two bytes into a live local buffer of two.
        if unsafe { libc::recv(socket, answer.as_mut_ptr().cast(), 2, 0) } != 2 {
            return false;
        }
        // An answer to an earlier question that timed out is skipped.
        if answer[0] == number {
            return answer[1] == 1;
        }
    }
}

/// Milliseconds of `CLOCK_MONOTONIC` (async-signal-safe: it runs in the signal handler).
fn monotonic_ms() -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and writes the live local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec * 1000 + now.tv_nsec / 1_000_000
}

/// Starts the witness: a child process in kreplay's process group that keeps the signals
/// kreplay passes on blocked, so that one sent to the group stays pending there, and answers,
/// for each question on its socket, whether it holds the signal asked about (taking it). It is
/// never taken
/// for a process the program left ([`adopted`]) and ends when its socket closes: at
/// [`Prepared`]'s drop, where it is reaped, or when kreplay ends. Without it (no process could
/// be started), a signal a process sent to kreplay's group is passed on, as one sent to
/// kreplay.
fn start_witness() {
    if WITNESS.load(Ordering::SeqCst) >= 0 {
        return;
    }
    let mut fds = [-1; 2];
    // SAFETY: socketpair writes two descriptors into the live array.
    let paired = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } == 0;
    if !paired {
        return;
    }
    let [ours, theirs] = fds;
    // Blocked across the fork, so that the witness holds them from its first instruction.
    let previous = block_passed_on();
    // SAFETY: in the forked child only async-signal-safe system calls are made (`witness`),
    // as this process may have other threads.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: a freshly forked process, `theirs` its end of the pair.
        unsafe { witness(theirs) };
    }
    // SAFETY: closes the witness's end here and restores the signal mask saved above.
    unsafe {
        libc::close(theirs);
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
    }
    if pid < 0 {
        // SAFETY: this process's own end, used by no one.
        unsafe { libc::close(ours) };
        return;
    }
    WITNESS_PID.store(pid, Ordering::SeqCst);
    WITNESS.store(ours, Ordering::SeqCst);
}

/// Blocks the signals of [`PASSED_ON`] on this thread; returns the mask it had.
fn block_passed_on() -> libc::sigset_t {
    // SAFETY: the sets are zeroed, then initialized by sigemptyset before use.
    unsafe {
        let mut blocked: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut blocked);
        for signal in PASSED_ON {
            libc::sigaddset(&mut blocked, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, &mut previous);
        previous
    }
}

/// Ends the witness, if any: its socket is closed (no handler is asking it then) and it is
/// reaped.
fn end_witness() {
    // The signals are blocked while the turn is held: a handler on this thread would wait for
    // it for good.
    let previous = block_passed_on();
    while ASKING
        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        std::thread::yield_now();
    }
    let socket = WITNESS.swap(-1, Ordering::SeqCst);
    ASKING.store(false, Ordering::SeqCst);
    // SAFETY: restores the mask block_passed_on saved.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut()) };
    let pid = WITNESS_PID.swap(0, Ordering::SeqCst);
    if socket >= 0 {
        // SAFETY: this process's end of the pair, no longer reachable through WITNESS.
        unsafe { libc::close(socket) };
    }
    if pid > 0 {
        let mut status = 0;
        // SAFETY: the witness is this process's child, not reaped yet (so the id is its own).
        // It ends once its socket closed, unless someone stopped it: it has nothing to finish,
        // and is killed so as never to be waited for in vain.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        // SAFETY: as above.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
    }
}

/// What [`prepare`] set up that must be undone once the program's runs are over: dropping it
/// ends the witness.
pub struct Prepared(());

impl Drop for Prepared {
    fn drop(&mut self) {
        end_witness();
    }
}

/// The witness's life (see [`start_witness`]): only async-signal-safe system calls.
///
/// # Safety
/// Called in a freshly forked process only, with `socket` its end of the socket pair.
unsafe fn witness(socket: libc::c_int) -> ! {
    // SAFETY: plain system calls on this process's own descriptors, signal mask and local
    // buffers.
    unsafe {
        // Every other descriptor is closed: the witness must hold no pipe open (kreplay's
        // standard output, a program's input).
        let (below, above) = ((socket - 1) as libc::c_uint, (socket + 1) as libc::c_uint);
        let none: libc::c_uint = 0;
        if libc::syscall(libc::SYS_close_range, none, below, none) != 0
            || libc::syscall(libc::SYS_close_range, above, libc::c_uint::MAX, none) != 0
        {
            for fd in 0..4096 {
                if fd != socket {
                    libc::close(fd);
                }
            }
        }
        loop {
            // [number, index of the signal in PASSED_ON].
            let mut question = [0u8; 2];
            let n = libc::recv(socket, question.as_mut_ptr().cast(), 2, 0);
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            if n != 2 {
                libc::_exit(0);
            }
            let mut got = 0u8;
            if let Some(&signal) = PASSED_ON.get(usize::from(question[1])) {
                let mut pending: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut pending);
                libc::sigpending(&mut pending);
                if libc::sigismember(&pending, signal) == 1 {
                    let mut one: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut one);
                    libc::sigaddset(&mut one, signal);
                    let now = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    };
                    libc::sigtimedwait(&one, std::ptr::null_mut(), &now);
                    got = 1;
                }
            }
            let answer = [question[0], got];
            libc::send(socket, answer.as_ptr().cast(), 2, libc::MSG_NOSIGNAL);
        }
    }
}

/// Whether `pid` is in kreplay's process group, where a signal sent to the group reached it
/// too (a program that moved to a group of its own did not get it).
fn in_our_group(pid: i32) -> bool {
    // SAFETY: getpgrp and getpgid are plain system calls with no memory arguments, safe in a
    // signal handler (getpgrp is async-signal-safe; getpgid is the same system call on Linux).
    unsafe { libc::getpgid(pid) == libc::getpgrp() }
}

/// From now on SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed on to the
/// program instead of ending `kreplay run` at once, and the program's orphaned descendants become this process's
/// children (so that ones still running can be told apart from ones that ended). A signal
/// ignored when `kreplay run` started (`nohup` ignores SIGHUP, a shell script's background job
/// SIGINT) stays ignored: the program inherits that, as it would without kreplay, where a
/// handler would be reset to the default action, ending the program, when it starts.
pub fn prepare() -> Prepared {
    // A SIGCHLD ignored (inherited from a parent that ignores it) has the kernel reap this
    // process's children itself: the program's exit status would be lost. It is waited for
    // here; the program still starts with it ignored ([`run`]).
    // SAFETY: reads the current action into a zeroed struct, and sets the default action
    // only in place of an ignored one.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
        {
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            SIGCHLD_IGNORED.store(true, Ordering::SeqCst);
        }
    }
    start_witness();
    for signal in PASSED_ON {
        // SAFETY: reads the current action into a zeroed struct; changes nothing.
        let ignored = unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(signal, std::ptr::null(), &mut current) == 0
                && current.sa_sigaction == libc::SIG_IGN
        };
        if ignored {
            continue;
        }
        // SAFETY: installs a handler that only stores to atomics and makes async-signal-safe
        // system calls; the sigaction struct is fully initialized. The signals passed on are
        // blocked while it runs, so that the handlers do not nest: signals are passed on in
        // the order they are handled.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = pass_on
                as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                as usize;
            libc::sigemptyset(&mut action.sa_mask);
            for blocked in PASSED_ON {
                libc::sigaddset(&mut action.sa_mask, blocked);
            }
            action.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
    // SAFETY: PR_SET_CHILD_SUBREAPER with 1 only changes who adopts this process's orphaned
    // descendants.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    Prepared(())
}

/// The signal that interrupted `kreplay run`, if any.
pub fn interrupted() -> Option<i32> {
    match INTERRUPTED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Whether processes the program started are still running at `deadline` (they were adopted
/// by this process, see [`prepare`]): the ones that end before it are reaped as they end, and
/// the answer comes as soon as none is left. When `kreplay run` was interrupted, the signal is
/// passed on to each of them as well (a launcher that ran its worker without `exec` ends on
/// it, leaving the worker), once each, except to those in kreplay's process group when it was
/// sent to the group (they got it already).
fn descendants_running(deadline: Instant) -> bool {
    let mut signalled = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: waits for any child without blocking; the program itself was reaped already.
        match unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } {
            pid if pid > 0 => continue,
            0 => {}
            _ => return false,
        }
        let left = adopted();
        if left.is_empty() {
            // The witness only.
            return false;
        }
        if let Some(signal) = interrupted() {
            // Those in kreplay's group got a signal sent to the group already.
            let got_it = |pid| TO_GROUP.load(Ordering::SeqCst) && in_our_group(pid);
            for pid in left {
                if !signalled.contains(&pid) && !got_it(pid) {
                    // SAFETY: `pid` is a child of this process that has not been reaped, so
                    // the id cannot name another process.
                    unsafe { libc::kill(pid, signal) };
                    signalled.push(pid);
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep(REAP_EVERY.min(deadline - now));
    }
}

/// This process's children (processes the program left, adopted): the processes whose parent,
/// in `/proc/<pid>/stat`, is this one, but the witness.
fn adopted() -> Vec<i32> {
    let me = std::process::id() as i32;
    let witness = WITNESS_PID.load(Ordering::SeqCst);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != witness)
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parent_in_stat(&stat))
                == Some(me)
        })
        .collect()
}

/// The parent process id in a `/proc/<pid>/stat` line (the fourth field; the second, the
/// command name in parentheses, may hold spaces and parentheses itself).
fn parent_in_stat(stat: &str) -> Option<i32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The program's standard input.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// kreplay's own, inherited.
    Inherit,
    /// kreplay's own, passed on through a pipe as the program reads it, and kept
    /// ([`Ran::input`]): read only as far as the program reads, so an input that stays open (a
    /// pipe from `ssh` or a parent process) does not hold up a program that reads none of it.
    Tee,
    /// These bytes, then the end of the input.
    Bytes(&'a [u8]),
    /// This file, from its offset on.
    File(&'a std::fs::File),
}

/// What a run of the program gave.
pub struct Ran {
    pub status: ExitStatus,
    /// With [`Input::Tee`]: what was read from kreplay's standard input while the program ran
    /// (all the program read, and perhaps a little more that it did not take).
    pub input: Vec<u8>,
    /// Its standard output, when captured.
    pub stdout: Vec<u8>,
    /// The standard output was still held open by a process the program left running: `stdout`
    /// is what arrived until it exited.
    pub output_held: bool,
    /// Processes the program started were still running after it exited.
    pub left_running: bool,
}

/// Runs `command` to its end with `input` as its standard input; its standard output is
/// captured when `capture` (else inherited).
pub fn run(command: &mut Command, input: Input<'_>, capture: bool) -> std::io::Result<Ran> {
    command.stdin(match input {
        Input::Inherit => Stdio::inherit(),
        Input::Tee | Input::Bytes(_) => Stdio::piped(),
        Input::File(file) => Stdio::from(file.try_clone()?),
    });
    command.stdout(if capture {
        Stdio::piped()
    } else {
        Stdio::inherit()
    });
    if SIGCHLD_IGNORED.load(Ordering::SeqCst) {
        // SAFETY: signal is async-signal-safe, and the closure touches nothing else.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    SPAWNING.store(true, Ordering::SeqCst);
    let spawned = command.spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            SPAWNING.store(false, Ordering::SeqCst);
            PENDING.store(0, Ordering::SeqCst);
            return Err(e);
        }
    };
    PROGRAM.store(child.id() as i32, Ordering::SeqCst);
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    pass_on_pending(child.id() as i32);
    let (feeder, teed) = match input {
        Input::Inherit | Input::File(_) => (None, None),
        Input::Bytes(bytes) => (feed(&mut child, bytes), None),
        Input::Tee => (None, tee(&mut child)),
    };
    let reader = child.stdout.take().map(read_all);
    let reaper = reap_orphans(child.id() as i32);
    let waited = wait_for_program(&mut child);
    CHILD.store(0, Ordering::SeqCst);
    // Stopped before the processes left behind are looked at (and signalled): from then on
    // only that loop reaps, so no process id it signals can have been reaped and reused.
    reaper.stop();
    let status = waited?;
    let deadline = Instant::now() + AFTER_EXIT;
    // The feeder is not waited for: the program may not read all of its input, and a write it
    // never takes fails once it has ended, unless a process it left behind holds its input
    // open, which would block that write for as long as that process lives. The tee's thread
    // may wait for more of kreplay's input for good: it is left to it too. Every byte the
    // program read was kept before it was passed on.
    drop(feeder);
    let input = teed.map_or_else(Vec::new, |kept| {
        kept.lock().unwrap_or_else(|e| e.into_inner()).clone()
    });
    let (stdout, output_held) = match reader {
        None => (Vec::new(), false),
        Some((read, done)) => {
            let held = done
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .is_err();
            let bytes = std::mem::take(&mut *read.lock().unwrap_or_else(|e| e.into_inner()));
            (bytes, held)
        }
    };
    Ok(Ran {
        status,
        input,
        stdout,
        output_held,
        left_running: descendants_running(deadline),
    })
}

/// Passes on to the program, `child`, the signals that came while it was being started (see
/// [`pass_on`]), each once.
fn pass_on_pending(child: i32) {
    let pending = PENDING.swap(0, Ordering::SeqCst);
    SPAWNING.store(false, Ordering::SeqCst);
    for (index, &signal) in PASSED_ON.iter().enumerate() {
        if pending & (1 << index) != 0 {
            // SAFETY: `child` is the program, just started and not waited for yet.
            unsafe { libc::kill(child, signal) };
        }
    }
}

/// Waits for the program to end. A program that moved to a process group of its own (as one
/// started by a job-control shell already is, so making itself a group leader changes nothing
/// there) and then reads from the terminal (or writes to it, with `stty tostop`) is stopped by
/// the kernel (SIGTTIN, SIGTTOU): only the terminal's foreground process group, kreplay's, may.
/// It would wait for good, and `kreplay run` with it. kreplay does what the shell would have:
/// while its own group holds the terminal, it hands the terminal to the program's group and
/// continues it (in the background, it does so once it is brought to the foreground). A Ctrl-Z
/// there stops the program's group: kreplay takes the terminal back and stops too, so that the
/// shell takes over, and once continued in the foreground hands the terminal over again. The
/// terminal is taken back when the program has ended.
fn wait_for_program(child: &mut Child) -> std::io::Result<ExitStatus> {
    let pid = child.id() as libc::pid_t;
    let mut terminal: Option<Terminal> = None;
    // The program is stopped on the terminal, which kreplay's group does not hold now.
    let mut waiting = false;
    loop {
        let flags = libc::WEXITED | libc::WSTOPPED | libc::WNOWAIT;
        // SAFETY: a zeroed siginfo_t is valid; waitid fills it. WNOWAIT: an exit is only looked
        // at, and left to `child.wait` below.
        let (found, changed, code, status) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let found = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                if waiting {
                    flags | libc::WNOHANG
                } else {
                    flags
                },
            );
            (found, info.si_pid(), info.si_code, info.si_status())
        };
        if found != 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if changed == 0 {
            // Nothing new (WNOHANG): look whether kreplay's group holds the terminal now.
            waiting = !terminal.as_ref().is_some_and(Terminal::give);
            if waiting {
                std::thread::sleep(Duration::from_millis(100));
            }
            continue;
        }
        if code != libc::CLD_STOPPED {
            break;
        }
        // SAFETY: takes the stop report just looked at (WNOHANG: an exit since is left).
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WSTOPPED | libc::WNOHANG,
            );
        }
        if matches!(status, libc::SIGTTIN | libc::SIGTTOU) {
            if terminal.is_none() {
                terminal = Terminal::open(pid);
            }
            // Without a terminal of its own or the program in kreplay's group, it stays
            // stopped, as under a shell without job control.
            waiting = terminal.as_ref().is_some_and(|t| !t.give());
        } else if status == libc::SIGTSTP
            && let Some(terminal) = &terminal
            && terminal.given()
        {
            // The user stopped the program's job (Ctrl-Z): kreplay's job stops with it, the
            // terminal back to its group, until the shell continues it.
            terminal.take_back();
            // SAFETY: stops this process, as the terminal's Ctrl-Z stops a job.
            unsafe { libc::kill(libc::getpid(), libc::SIGTSTP) };
            waiting = !terminal.give();
        }
        // Stopped by someone else (SIGSTOP): whoever stopped it continues it.
    }
    let status = child.wait();
    if let Some(terminal) = terminal
        && terminal.given()
    {
        terminal.take_back();
    }
    status
}

/// kreplay's controlling terminal, for a program in a process group of its own.
struct Terminal {
    fd: libc::c_int,
    program_group: libc::pid_t,
}

impl Terminal {
    /// The controlling terminal, when there is one and `program` leads a process group other
    /// than kreplay's.
    fn open(program: libc::pid_t) -> Option<Terminal> {
        // SAFETY: plain system calls; the descriptor is closed when it is not kept.
        unsafe {
            let group = libc::getpgid(program);
            if group <= 0 || group == libc::getpgrp() {
                return None;
            }
            let fd = libc::open(
                c"/dev/tty".as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            );
            (fd >= 0).then_some(Terminal {
                fd,
                program_group: group,
            })
        }
    }

    /// Whether the program's group holds the terminal.
    fn given(&self) -> bool {
        // SAFETY: tcgetpgrp on the descriptor this value holds.
        unsafe { libc::tcgetpgrp(self.fd) == self.program_group }
    }

    /// Makes the program's group the terminal's foreground group and continues it, when
    /// kreplay's group holds the terminal (or the program's does already); `false` otherwise.
    fn give(&self) -> bool {
        // SAFETY: getpgrp has no arguments; tcgetpgrp reads the descriptor this value holds.
        let holder = unsafe { libc::tcgetpgrp(self.fd) };
        // SAFETY: as above.
        if holder != unsafe { libc::getpgrp() } && holder != self.program_group {
            return false;
        }
        self.set_foreground(self.program_group);
        // SAFETY: continues the program's process group, which the program made and leads.
        unsafe { libc::kill(-self.program_group, libc::SIGCONT) };
        true
    }

    /// Makes kreplay's group the terminal's foreground group again.
    fn take_back(&self) {
        // SAFETY: getpgrp has no arguments.
        self.set_foreground(unsafe { libc::getpgrp() });
    }

    /// `tcsetpgrp` with SIGTTOU blocked on this thread: kreplay is not in the foreground when it
    /// takes the terminal back, where the call would otherwise stop it.
    fn set_foreground(&self, group: libc::pid_t) {
        // SAFETY: the sets are zeroed, then initialized by sigemptyset; the mask is restored.
        unsafe {
            let mut blocked: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut blocked);
            libc::sigaddset(&mut blocked, libc::SIGTTOU);
            libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, &mut previous);
            libc::tcsetpgrp(self.fd, group);
            libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // SAFETY: the descriptor this value opened, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// How often, while the program runs, processes it orphaned (adopted by this process) that
/// ended are reaped.
const REAP_ORPHANS_EVERY: Duration = Duration::from_millis(100);

/// The thread of [`reap_orphans`].
struct Reaper {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Reaper {
    /// Stops the thread and waits for it.
    fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// Reaps, while the program `program` runs, the processes it orphaned that ended (this process
/// adopts them, see [`prepare`]): each would stay a zombie until the program's end, holding its
/// process id, which a long run starting helpers through a shell that exits at once piles up
/// until its own forks fail. The program itself is left to its wait.
fn reap_orphans(program: i32) -> Reaper {
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(REAP_ORPHANS_EVERY) {
            loop {
                // SAFETY: a zeroed siginfo_t is valid; waitid fills it. WNOWAIT only looks: a
                // process is reaped below, by its id, when it is not the program (which, found
                // first, stops the round: the program's own wait comes).
                let ended = unsafe {
                    let mut info: libc::siginfo_t = std::mem::zeroed();
                    let found = libc::waitid(
                        libc::P_ALL,
                        0,
                        &mut info,
                        libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                    );
                    if found == 0 { info.si_pid() } else { 0 }
                };
                if ended <= 0 || ended == program {
                    break;
                }
                // A witness that ended (killed by someone) is reaped too, and forgotten: it
                // comes first among the children, and would stop every round.
                let _ = WITNESS_PID.compare_exchange(ended, 0, Ordering::SeqCst, Ordering::SeqCst);
                let mut status = 0;
                // SAFETY: `ended` is a child of this process that ended and that nothing else
                // reaps while the program runs.
                unsafe { libc::waitpid(ended, &mut status, libc::WNOHANG) };
            }
        }
    });
    Reaper { stop, thread }
}

/// Writes `input` to the child's standard input on a thread of its own, then closes it.
fn feed(child: &mut Child, input: &[u8]) -> Option<std::thread::JoinHandle<()>> {
    let (mut pipe, input) = (child.stdin.take()?, input.to_vec());
    Some(std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    }))
}

/// Passes kreplay's standard input on to the child's on a thread of its own, keeping every
/// byte before it is passed on; the child's input ends where kreplay's does, or when the child
/// stops taking it.
fn tee(child: &mut Child) -> Option<Arc<Mutex<Vec<u8>>>> {
    let mut pipe = child.stdin.take()?;
    let kept = Arc::new(Mutex::new(Vec::new()));
    let into = kept.clone();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    into.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend_from_slice(&buf[..n]);
                    if pipe.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
    Some(kept)
}

/// Reads `pipe` to its end on a thread of its own, into the buffer returned; the receiver
/// hears once the pipe closed (a process the program left running may keep it open).
fn read_all(mut pipe: impl Read + Send + 'static) -> (Arc<Mutex<Vec<u8>>>, mpsc::Receiver<()>) {
    let (tx, rx) = mpsc::channel();
    let read = Arc::new(Mutex::new(Vec::new()));
    let into = read.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => into
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&buf[..n]),
            }
        }
        let _ = tx.send(());
    });
    (read, rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_read_without_allocating_is_the_systems() {
        // SAFETY: getpid and getppid have no arguments.
        let (me, parent) = unsafe { (libc::getpid(), libc::getppid()) };
        assert_eq!(parent_of(me), Some(parent));
        assert_eq!(parent_of(i32::MAX), None);
        assert!(from_the_program(me) && !from_the_program(parent));
    }

    #[test]
    fn the_parent_is_read_after_the_command_name_whatever_it_holds() {
        assert_eq!(parent_in_stat("42 (sleep) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_in_stat("42 (a) b) (c) R 9 1 1"), Some(9));
        assert_eq!(parent_in_stat("garbage"), None);
    }
}
