//! The audit's SVG plots (`plotters`), drawn from the report's figures only: bandwidth, p50 latency and Host CPU per
//! transfer against block size per path (median, with the min-max spread as bars), and the latency CDF of the first
//! workload per path.

use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use super::report::{AuditReport, CellStats, Stats};

/// A path's colour, the same in every plot.
fn colour(path: &str) -> RGBColor {
    match path {
        "aiv" => RGBColor(200, 30, 30),
        "adxl" => RGBColor(30, 80, 200),
        "adxl-fabric" => RGBColor(0, 160, 190),
        "ubshmem" => RGBColor(20, 140, 60),
        "tcp" => RGBColor(150, 60, 170),
        "mooncake-ascend" => RGBColor(230, 140, 20),
        "mooncake-ascend+aiv" => RGBColor(120, 70, 20),
        _ => RGBColor(90, 90, 90),
    }
}

/// One line of a plot: a label, a colour, and points `(x, median, min, max)`.
struct Line {
    label: String,
    colour: RGBColor,
    points: Vec<(f64, f64, f64, f64)>,
}

/// Draws every plot the report has data for into `dir`; returns the file names written. A plot that fails is
/// reported on stderr and left out.
pub(super) fn draw(report: &AuditReport, dir: &Path) -> Vec<String> {
    let mut written = Vec::new();
    // The size sweep: single-thread workloads, one per block size (the first of each), by block size.
    let mut sweep: Vec<&super::report::WorkloadReport> =
        report.workloads.iter().filter(|w| w.workload.threads == 1 && w.workload.shape.is_none()).collect();
    sweep.sort_by_key(|w| w.workload.block_size);
    sweep.dedup_by_key(|w| w.workload.block_size);
    if sweep.len() >= 2 {
        let lines = |figure: &dyn Fn(&CellStats) -> Option<Stats>, scale: f64, memcpy: bool| {
            let mut lines: Vec<Line> = report
                .paths
                .iter()
                .map(|path| Line {
                    label: path.clone(),
                    colour: colour(path),
                    points: sweep
                        .iter()
                        .filter_map(|w| {
                            let cell = w.paths.iter().find(|c| &c.path == path)?;
                            let s = figure(cell)?;
                            Some((w.workload.block_size as f64, s.median * scale, s.min * scale, s.max * scale))
                        })
                        .collect(),
                })
                .collect();
            if memcpy {
                lines.push(Line {
                    label: "memcpy".into(),
                    colour: RGBColor(0, 0, 0),
                    points: sweep
                        .iter()
                        .filter_map(|w| {
                            let s = w.memcpy_bytes_per_second?;
                            Some((w.workload.block_size as f64, s.median * scale, s.min * scale, s.max * scale))
                        })
                        .collect(),
                });
            }
            lines
        };
        let plots: [(&str, &str, &str, Vec<Line>, bool); 3] = [
            (
                "bandwidth_vs_size.svg",
                "Bandwidth (median, min-max bars)",
                "GB/s",
                lines(&|c| c.bytes_per_second, 1e-9, true),
                false,
            ),
            ("latency_p50_vs_size.svg", "Batch latency p50", "µs", lines(&|c| c.latency_p50_ns, 1e-3, false), true),
            (
                "host_cpu_vs_size.svg",
                "Host CPU per transfer, whole process",
                "µs",
                lines(&|c| c.process_cpu_ns_per_transfer, 1e-3, false),
                true,
            ),
        ];
        for (file, title, unit, lines, log_y) in plots {
            let result = vs_size(&dir.join(file), title, unit, &lines, log_y);
            note(&mut written, file, result);
        }
    }
    if let Some(workload) = report.workloads.first() {
        let file = "latency_cdf.svg";
        let title = format!("Batch latency CDF, {}", workload.name);
        let result = latency_cdf(&dir.join(file), &title, &workload.paths);
        note(&mut written, file, result);
    }
    written
}

fn note(written: &mut Vec<String>, file: &str, result: Result<bool, String>) {
    match result {
        Ok(true) => written.push(file.into()),
        Ok(false) => {}
        Err(error) => eprintln!("aiv audit: plot {file} not drawn: {error}"),
    }
}

/// Points' range, padded for a log axis (factor) or a linear one from 0.
fn y_range(lines: &[Line], log_y: bool) -> Option<(f64, f64)> {
    let values = lines.iter().flat_map(|l| l.points.iter().flat_map(|p| [p.2, p.3]));
    let (lo, hi) = values
        .filter(|v| v.is_finite() && (*v > 0.0 || !log_y))
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return None;
    }
    Some(if log_y { (lo / 1.5, hi * 1.5) } else { (0.0, hi * 1.1 + f64::EPSILON) })
}

/// A figure against block size (log x), one line per path with min-max bars; `Ok(false)` if there is nothing to draw.
fn vs_size(file: &Path, title: &str, unit: &str, lines: &[Line], log_y: bool) -> Result<bool, String> {
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (x_lo, x_hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let Some((y_lo, y_hi)) = y_range(lines, log_y) else { return Ok(false) };
    if x_lo >= x_hi {
        return Ok(false);
    }
    let x = (x_lo / 1.5..x_hi * 1.5).log_scale();
    if log_y {
        chart(file, title, unit, x, (y_lo..y_hi).log_scale(), lines)
    } else {
        chart(file, title, unit, x, y_lo..y_hi, lines)
    }
}

fn chart<Y>(
    file: &Path,
    title: &str,
    unit: &str,
    x: impl AsRangedCoord<Value = f64, CoordDescType: ValueFormatter<f64>>,
    y: Y,
    lines: &[Line],
) -> Result<bool, String>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let root = canvas(file)?;
    let mut chart = builder(&root, title, 60).build_cartesian_2d(x, y).map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .x_desc("block size (bytes)")
        .y_desc(unit)
        .x_label_formatter(&|v| axis_bytes(*v))
        .draw()
        .map_err(|e| error(&e))?;
    for line in lines.iter().filter(|l| !l.points.is_empty()) {
        let style = line.colour.stroke_width(2);
        chart
            .draw_series(LineSeries::new(line.points.iter().map(|p| (p.0, p.1)), style))
            .map_err(|e| error(&e))?
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        chart
            .draw_series(
                line.points.iter().map(|p| ErrorBar::new_vertical(p.0, p.2, p.1, p.3, line.colour.filled(), 6)),
            )
            .map_err(|e| error(&e))?;
    }
    finish(&mut chart, &root)
}

/// Draws the legend and writes the file.
fn finish<'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
) -> Result<bool, String> {
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(true)
}

/// A white 720 x 440 SVG canvas at `file`.
fn canvas(file: &Path) -> Result<DrawingArea<SVGBackend<'_>, plotters::coord::Shift>, String> {
    let root = SVGBackend::new(file, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    Ok(root)
}

/// Every plot's frame: the title, margins and label areas (`y_area` pixels for the y labels).
fn builder<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: &str,
    y_area: u32,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder.caption(title, ("sans-serif", 18)).margin(12).x_label_area_size(40).y_label_area_size(y_area);
    builder
}

/// A log axis' tick (the ticks are powers of ten) in decimal units: `10 kB`, `1 MB`.
fn axis_bytes(value: f64) -> String {
    let (scaled, unit) = match value {
        v if v >= 1e9 => (v / 1e9, "GB"),
        v if v >= 1e6 => (v / 1e6, "MB"),
        v if v >= 1e3 => (v / 1e3, "kB"),
        v => (v, "B"),
    };
    let text = format!("{scaled:.1}");
    format!("{} {unit}", text.trim_end_matches('0').trim_end_matches('.'))
}

/// Each path's latency CDF (log x, µs); `Ok(false)` if no path measured one.
fn latency_cdf(file: &Path, title: &str, cells: &[CellStats]) -> Result<bool, String> {
    let points = cells.iter().flat_map(|c| c.latency_cdf.iter().map(|p| p[1] * 1e-3)).filter(|v| *v > 0.0);
    let (lo, hi) = points.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo >= hi {
        return Ok(false);
    }
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let root = canvas(file)?;
    let mut chart = builder(&root, title, 50)
        .build_cartesian_2d((lo / 1.2..hi * 1.2).log_scale(), 0f64..1f64)
        .map_err(|e| error(&e))?;
    chart.configure_mesh().x_desc("latency (µs)").y_desc("fraction of batches").draw().map_err(|e| error(&e))?;
    for cell in cells.iter().filter(|c| !c.latency_cdf.is_empty()) {
        let style = colour(&cell.path).stroke_width(2);
        chart
            .draw_series(LineSeries::new(cell.latency_cdf.iter().map(|p| ((p[1] * 1e-3).max(lo), p[0])), style))
            .map_err(|e| error(&e))?
            .label(cell.path.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    finish(&mut chart, &root)
}

#[cfg(test)]
mod tests {
    #[test]
    fn axis_ticks_read_in_decimal_units() {
        assert_eq!(super::axis_bytes(10_000.0), "10 kB");
        assert_eq!(super::axis_bytes(1_000_000.0), "1 MB");
        assert_eq!(super::axis_bytes(2_500_000.0), "2.5 MB");
        assert_eq!(super::axis_bytes(512.0), "512 B");
    }
}
