//! Running the program of `kreplay run` as a child process: its standard input given to both
//! runs of `--check` alike, its standard output captured without waiting for processes it left
//! running, and interruptions (SIGINT, SIGTERM, SIGHUP) passed on to it, so that `kreplay run`
//! cleans up after itself instead of dying first. One the terminal sent (Ctrl-C, a hangup) went
//! to the whole foreground process group, the program included: it is not passed on again to
//! a process still in kreplay's group, so the program gets one SIGINT per Ctrl-C, as it would
//! without kreplay (a program that force-quits on a second one would skip its cleanup).

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// The program's process while it runs (0: none): where an interruption is passed on.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The signal that interrupted `kreplay run` (0: none).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);
/// Whether the terminal sent the latest interruption, to kreplay's whole process group.
static FROM_TERMINAL: AtomicBool = AtomicBool::new(false);

/// How long, after the program exited, the rest of its standard output may take to arrive and
/// the processes it leaves behind may take to end: what it wrote is in the pipe already, so
/// only a process it left running and holding the pipe can make the output take longer, and
/// helpers that end when the program does (Python's multiprocessing resource tracker and fork
/// server end once its end closes their pipe, after cleaning up) need a moment too.
const AFTER_EXIT: Duration = Duration::from_secs(2);
/// How often the processes left behind are looked at while they are waited for.
const REAP_EVERY: Duration = Duration::from_millis(10);

extern "C" fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // A signal the terminal's driver sent (Ctrl-C, a hangup) comes from the kernel; one a
    // process sent with kill comes from that process (SI_USER), whether to kreplay alone or
    // to its group, which cannot be told apart: it is passed on.
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t (checked for null anyway).
    let from_terminal = !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL;
    // Both describe the latest interruption (a SIGTERM from a job runner after a Ctrl-C is
    // still passed on to the processes the program left behind).
    FROM_TERMINAL.store(from_terminal, Ordering::SeqCst);
    INTERRUPTED.store(signal, Ordering::SeqCst);
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 && !(from_terminal && in_our_group(child)) {
        // SAFETY: kill is async-signal-safe; the pid is the program's, set only while it runs
        // (cleared as soon as it was waited for).
        unsafe { libc::kill(child, signal) };
    }
}

/// Whether `pid` is in kreplay's process group, where a signal from the terminal reached it
/// too (a program that moved to a group of its own did not get it).
fn in_our_group(pid: i32) -> bool {
    // SAFETY: getpgrp and getpgid are plain system calls with no memory arguments, safe in a
    // signal handler (getpgrp is async-signal-safe; getpgid is the same system call on Linux).
    unsafe { libc::getpgid(pid) == libc::getpgrp() }
}

/// From now on SIGINT, SIGTERM and SIGHUP are passed on to the program instead of ending
/// `kreplay run` at once, and the program's orphaned descendants become this process's
/// children (so that ones still running can be told apart from ones that ended). A signal
/// ignored when `kreplay run` started (`nohup` ignores SIGHUP, a shell script's background job
/// SIGINT) stays ignored: the program inherits that, as it would without kreplay, where a
/// handler would be reset to the default action, ending the program, when it starts.
pub fn prepare() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
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
        // system calls; the sigaction struct is fully initialized. The three signals are
        // blocked while it runs, so that the handlers do not nest: signals are passed on in
        // the order they are handled.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = pass_on
                as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                as usize;
            libc::sigemptyset(&mut action.sa_mask);
            for blocked in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut action.sa_mask, blocked);
            }
            action.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
    // SAFETY: PR_SET_CHILD_SUBREAPER with 1 only changes who adopts this process's orphaned
    // descendants.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
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
/// it, leaving the worker), once each, except to those in kreplay's process group when the
/// terminal sent it (they got it from the terminal).
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
        if let Some(signal) = interrupted() {
            // Those in kreplay's group got a signal from the terminal already.
            let got_it = |pid| FROM_TERMINAL.load(Ordering::SeqCst) && in_our_group(pid);
            for pid in adopted() {
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
/// in `/proc/<pid>/stat`, is this one.
fn adopted() -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
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
    });
    command.stdout(if capture {
        Stdio::piped()
    } else {
        Stdio::inherit()
    });
    let mut child = command.spawn()?;
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    let (feeder, teed) = match input {
        Input::Inherit => (None, None),
        Input::Bytes(bytes) => (feed(&mut child, bytes), None),
        Input::Tee => (None, tee(&mut child)),
    };
    let reader = child.stdout.take().map(read_all);
    let waited = child.wait();
    CHILD.store(0, Ordering::SeqCst);
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
    fn the_parent_is_read_after_the_command_name_whatever_it_holds() {
        assert_eq!(parent_in_stat("42 (sleep) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_in_stat("42 (a) b) (c) R 9 1 1"), Some(9));
        assert_eq!(parent_in_stat("garbage"), None);
    }
}
