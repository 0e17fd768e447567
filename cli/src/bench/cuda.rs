//! `kreplay bench --backend cuda`: the measurements of [`kreplay_cuda::bench`] (restore cost per
//! tier, strategy and written fraction on a GPU, beside the copy and read ceilings of the same
//! run), written as CSV to standard output as they are measured and, with `--csv`, to a file
//! as well, whole once every row is measured (see [`crate::output`]); then, on
//! standard output only, the restore targets judged from those rows
//! ([`kreplay_cuda::bench::judge`]).

use std::io::{self, Write};
use std::path::Path;

use kreplay_cuda::bench::{BenchConfig, TargetCheck};

use super::{Verdict, render_verdicts};

/// Writes everything to `out` and keeps a copy for the CSV file.
struct Tee<'a> {
    out: &'a mut dyn Write,
    kept: Vec<u8>,
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write_all(buf)?;
        self.kept.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Runs the measurements; rows go to `out` as they are measured and to `csv` once all were
/// (a run that fails part way leaves the file as it was), the judged targets to `out` after
/// them.
pub fn run(config: &BenchConfig, csv: Option<&Path>, out: &mut dyn Write) -> Result<(), String> {
    config.validate()?;
    // The settings first, as for every command that installs kreplay: the bench reads none of
    // them (its tiers and strategies come from the command line), but a bad one is still a
    // mistake to report rather than measure past.
    super::checked_settings()?;
    kreplay_cuda::config::Config::from_lookup(|name| std::env::var(name).ok())?;
    // Then the driver: no file is created where nothing can be measured.
    kreplay_cuda::demo::driver()?;
    let mut tee = Tee {
        out,
        kept: Vec::new(),
    };
    let figures = kreplay_cuda::bench::run(config, &mut tee)?;
    tee.flush()
        .map_err(|e| format!("cannot write the output: {e}"))?;
    if let Some(path) = csv {
        crate::output::write_whole(path, &tee.kept)?;
    }
    let checks = kreplay_cuda::bench::judge(config, &figures);
    let replays = kreplay_cuda::bench::render_replays(&figures.replays);
    let replays = if replays.is_empty() {
        replays
    } else {
        format!("\n{replays}")
    };
    write!(tee.out, "\n{}{replays}", render_targets(&checks))
        .and_then(|()| tee.out.flush())
        .map_err(|e| format!("cannot write the output: {e}"))
}

/// The targets section of the GPU bench (see [`render_verdicts`]; each detail names the
/// verified strategy it judged).
pub fn render_targets(checks: &[TargetCheck]) -> String {
    let lines: Vec<Verdict<'_>> = checks
        .iter()
        .map(|c| Verdict {
            target: c.target,
            footprint: c.footprint,
            tier: Some(c.tier.as_str()),
            met: c.met,
            detail: &c.detail,
        })
        .collect();
    render_verdicts(&lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kreplay_cuda::bench::BenchTier;
    use kreplay_snapshot::RestoreStrategy;

    fn check(tier: BenchTier, strategy: Option<RestoreStrategy>, met: Option<bool>) -> TargetCheck {
        TargetCheck {
            target: "verified restore of 1% <= 1/2 of a full restore",
            tier,
            footprint: strategy.map(|_| 32 << 30),
            strategy,
            met,
            detail: match strategy {
                Some(s) => format!("{s} at 1%: 7.760 ms = 0.487 (1/2) of full restore"),
                None => "32 GiB not measured".into(),
            },
        }
    }

    #[test]
    fn gpu_verdicts_are_grouped_under_their_target_and_counted() {
        let text = render_targets(&[
            check(BenchTier::Device, Some(RestoreStrategy::Hash), Some(true)),
            check(
                BenchTier::Device,
                Some(RestoreStrategy::Writeset),
                Some(false),
            ),
            check(BenchTier::Squeezed, None, None),
        ]);
        assert_eq!(
            text.matches("verified restore of 1% <= 1/2").count(),
            1,
            "one heading: {text}"
        );
        for part in [
            "32GiB  device    met            hash at 1%: 7.760 ms",
            "32GiB  device    NOT MET        writeset at 1%: 7.760 ms",
            "-      squeezed  not evaluated  32 GiB not measured",
            "1 met, 1 not met, 1 not evaluated",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }
}
