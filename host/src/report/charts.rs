//! How the report's charts are drawn: SVG from plotters, no script.
//!
//! Two kinds of figure, both described as plain data by the page
//! ([`super::html`]) and drawn here:
//! - [`LevelFigure`]: a quantity against the stage level (concurrency or
//!   rate), one line per series, with marks for the congested stage,
//!   skipped stages and stages whose server signal had no data;
//! - [`TimelineFigure`]: a quantity over the run's time, with the stages
//!   shaded behind it (the gaps between them are the checks, when the load
//!   holds the finished stage's level).
//!
//! Non-finite values are left out of every series, so a chart never carries
//! a broken path.

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

/// Pixels of one chart.
pub const SIZE: (u32, u32) = (600, 300);
/// Room on the right of a chart for its legend, so it never hides data.
const LEGEND_WIDTH: u32 = 170;
const FONT: &str = "sans-serif";

/// Colours of the runs (one per run when several are overlaid), each with
/// three shades for the p50, p90 and p99 of a quantity.
pub const RUN_SHADES: [[RGBColor; 3]; 4] = [
    [
        RGBColor(31, 119, 180),
        RGBColor(94, 158, 214),
        RGBColor(158, 202, 225),
    ],
    [
        RGBColor(230, 85, 13),
        RGBColor(253, 141, 60),
        RGBColor(253, 190, 133),
    ],
    [
        RGBColor(49, 163, 84),
        RGBColor(116, 196, 118),
        RGBColor(186, 228, 179),
    ],
    [
        RGBColor(117, 107, 177),
        RGBColor(158, 154, 200),
        RGBColor(203, 201, 226),
    ],
];
/// The congested stage's marks and the thresholds' lines.
pub const CONGESTED: RGBColor = RGBColor(214, 39, 40);
const MUTED: RGBColor = RGBColor(140, 140, 140);

/// How values on the y axis read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unit {
    /// Plain numbers.
    Count,
    /// Seconds, shown in milliseconds.
    Millis,
    /// A fraction, shown as a percentage.
    Percent,
}

impl Unit {
    fn format(self, v: f64) -> String {
        match self {
            Unit::Count if v.abs() >= 1000.0 => format!("{:.0}", v),
            Unit::Count if v.fract() == 0.0 => format!("{v:.0}"),
            Unit::Count => format!("{v:.1}"),
            Unit::Millis => format!("{:.0}", v * 1000.0),
            Unit::Percent => format!("{:.0}%", v * 100.0),
        }
    }
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub name: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
    /// Dashed: a threshold rather than a measurement.
    pub dashed: bool,
}

/// What a mark on a level chart says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MarkKind {
    /// The stage the policy called congested (at the stage's value).
    Congested,
    /// A stage that did not run (on the x axis).
    Skipped,
    /// A judged stage whose server signal had no data (on the x axis).
    NoData,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub kind: MarkKind,
    pub x: f64,
    /// Where on the y axis; `None` puts it on the x axis.
    pub y: Option<f64>,
}

/// The x axis of level charts: the stage levels (concurrency or rate) in
/// increasing order, evenly spaced, one tick each (a sweep's levels are the
/// user's choice: 64, 128, ... or 4, 8, 16, ... read alike).
#[derive(Debug, Clone, PartialEq)]
pub struct LevelAxis {
    pub label: String,
    pub levels: Vec<f64>,
}

impl LevelAxis {
    pub fn new(label: &str, levels: &[f64]) -> LevelAxis {
        let mut levels: Vec<f64> = levels.iter().copied().filter(|v| v.is_finite()).collect();
        levels.sort_by(f64::total_cmp);
        levels.dedup();
        LevelAxis {
            label: label.to_owned(),
            levels,
        }
    }

    /// The position of a level on the axis.
    fn position(&self, level: f64) -> Option<SegmentValue<i32>> {
        let i = self.levels.iter().position(|&l| l == level)?;
        Some(SegmentValue::CenterOf(i32::try_from(i).ok()?))
    }

    /// The label of an axis position: every level while they fit, else
    /// every k-th one.
    fn label_at(&self, value: &SegmentValue<i32>) -> String {
        let step = self.levels.len().div_ceil(16).max(1);
        match value {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => usize::try_from(*i)
                .ok()
                .filter(|i| i % step == 0)
                .and_then(|i| self.levels.get(i))
                .map(|&l| Unit::Count.format(l))
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        }
    }
}

/// A quantity against the stage level.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelFigure {
    pub title: String,
    pub x: LevelAxis,
    pub y_label: String,
    pub unit: Unit,
    pub lines: Vec<Line>,
    pub marks: Vec<Mark>,
}

/// What a shaded span of the timeline is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SpanKind {
    Measured,
    Warmup,
    Congested,
}

/// A stage's time on the timeline (seconds since the run started).
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub kind: SpanKind,
    pub from: f64,
    pub to: f64,
    pub label: String,
}

/// A shaded band: its name, colour and `(x, low, high)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub name: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64, f64)>,
}

/// A quantity over the run's time.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineFigure {
    pub title: String,
    pub y_label: String,
    pub unit: Unit,
    pub end_s: f64,
    pub spans: Vec<Span>,
    /// A shaded band between two values per instant (e.g. TTFT p50..p99).
    pub band: Option<Band>,
    pub lines: Vec<Line>,
}

/// Why a chart could not be drawn (plotters' error as text).
fn plot_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing a chart: {e}")
}

fn finite(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect()
}

/// 0 up to a little above the largest value (1 when there is none).
fn y_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let top = values.filter(|v| v.is_finite()).fold(0.0, f64::max);
    if top > 0.0 { 0.0..top * 1.12 } else { 0.0..1.0 }
}

fn line_style(color: RGBColor, dashed: bool) -> ShapeStyle {
    if dashed {
        color.stroke_width(1)
    } else {
        color.stroke_width(2)
    }
}

/// What a legend entry shows beside its name.
#[derive(Clone, Copy)]
enum Glyph {
    Line(RGBColor, bool),
    Band(RGBColor),
    Mark(MarkKind),
}

/// Draws the legend in the room kept on the right of the plotting area
/// (outside it, so it never hides data).
fn draw_legend(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    entries: &[(String, Glyph)],
) -> anyhow::Result<()> {
    let x = root.dim_in_pixel().0 as i32 - LEGEND_WIDTH as i32 + 4;
    for (i, (name, glyph)) in entries.iter().enumerate() {
        let y = 40 + 16 * i as i32;
        match *glyph {
            Glyph::Line(color, dashed) => root.draw(&PathElement::new(
                vec![(x, y), (x + 16, y)],
                line_style(color, dashed),
            )),
            Glyph::Band(color) => root.draw(&Rectangle::new(
                [(x, y - 4), (x + 16, y + 4)],
                color.mix(0.35).filled(),
            )),
            Glyph::Mark(kind) => {
                let (color, width) = mark_style(kind);
                match kind {
                    MarkKind::Skipped => {
                        root.draw(&Cross::new((x + 8, y), 4, color.stroke_width(width)))
                    }
                    _ => root.draw(&Circle::new((x + 8, y), 4, color.stroke_width(width))),
                }
            }
        }
        .map_err(plot_error)?;
        root.draw(&Text::new(
            name.clone(),
            (x + 22, y - 6),
            (FONT, 11).into_font(),
        ))
        .map_err(plot_error)?;
    }
    Ok(())
}

fn mark_style(kind: MarkKind) -> (RGBColor, u32) {
    match kind {
        MarkKind::Congested => (CONGESTED, 3),
        MarkKind::Skipped => (MUTED, 2),
        MarkKind::NoData => (MUTED, 1),
    }
}

/// Draws a level figure as an SVG document.
pub fn level_chart(figure: &LevelFigure) -> anyhow::Result<String> {
    let axis = &figure.x;
    let at = |(x, y): (f64, f64)| Some((axis.position(x)?, y));
    let y = y_range(
        figure
            .lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .chain(figure.marks.iter().filter_map(|m| m.y)),
    );
    // A segmented range 0..n has n + 1 slots: one per level is 0..levels - 1.
    let last = i32::try_from(axis.levels.len().saturating_sub(1)).unwrap_or(i32::MAX);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&figure.title, (FONT, 16))
            .margin(8)
            .margin_right(LEGEND_WIDTH)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d((0..last).into_segmented(), y.clone())
            .map_err(plot_error)?;
        let unit = figure.unit;
        chart
            .configure_mesh()
            .x_desc(&axis.label)
            .y_desc(&figure.y_label)
            .x_labels(axis.levels.len().max(1))
            .x_label_formatter(&|v| axis.label_at(v))
            .y_label_formatter(&|v| unit.format(*v))
            .disable_x_mesh()
            .light_line_style(WHITE)
            .draw()
            .map_err(plot_error)?;

        let mut legend = Vec::new();
        for line in &figure.lines {
            let points: Vec<_> = finite(&line.points).into_iter().filter_map(at).collect();
            if points.is_empty() {
                continue;
            }
            let style = line_style(line.color, line.dashed);
            if line.dashed {
                chart.draw_series(DashedLineSeries::new(points, 6, 4, style))
            } else {
                chart.draw_series(LineSeries::new(points, style).point_size(3))
            }
            .map_err(plot_error)?;
            legend.push((line.name.clone(), Glyph::Line(line.color, line.dashed)));
        }

        for kind in [MarkKind::Skipped, MarkKind::NoData, MarkKind::Congested] {
            let points: Vec<_> = figure
                .marks
                .iter()
                .filter(|m| m.kind == kind)
                .filter_map(|m| at((m.x, m.y.filter(|y| y.is_finite()).unwrap_or(y.start))))
                .collect();
            if points.is_empty() {
                continue;
            }
            let (color, width) = mark_style(kind);
            let style = color.stroke_width(width);
            match kind {
                MarkKind::Congested => {
                    chart.draw_series(points.into_iter().map(|p| Circle::new(p, 7, style)))
                }
                MarkKind::Skipped => {
                    chart.draw_series(points.into_iter().map(|p| Cross::new(p, 5, style)))
                }
                MarkKind::NoData => {
                    chart.draw_series(points.into_iter().map(|p| Circle::new(p, 5, style)))
                }
            }
            .map_err(plot_error)?;
            let name = match kind {
                MarkKind::Congested => "congested",
                MarkKind::Skipped => "skipped (not run)",
                MarkKind::NoData => "no data",
            };
            legend.push((name.to_owned(), Glyph::Mark(kind)));
        }
        draw_legend(&root, &legend)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// Draws a timeline figure as an SVG document.
pub fn timeline_chart(figure: &TimelineFigure) -> anyhow::Result<String> {
    let end = if figure.end_s.is_finite() && figure.end_s > 0.0 {
        figure.end_s
    } else {
        1.0
    };
    let y = y_range(
        figure
            .lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .chain(
                figure
                    .band
                    .iter()
                    .flat_map(|band| band.points.iter().map(|p| p.2)),
            ),
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (SIZE.0 * 2, SIZE.1)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&figure.title, (FONT, 16))
            .margin(8)
            .margin_right(LEGEND_WIDTH)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(0.0..end, y.clone())
            .map_err(plot_error)?;
        let unit = figure.unit;
        chart
            .configure_mesh()
            .x_desc("seconds since the run started")
            .y_desc(&figure.y_label)
            .y_label_formatter(&|v| unit.format(*v))
            .light_line_style(WHITE)
            .draw()
            .map_err(plot_error)?;

        for span in &figure.spans {
            let color = match span.kind {
                SpanKind::Measured => RGBColor(31, 119, 180).mix(0.07),
                SpanKind::Warmup => MUTED.mix(0.12),
                SpanKind::Congested => CONGESTED.mix(0.12),
            };
            let (from, to) = (span.from.max(0.0), span.to.min(end));
            if to.partial_cmp(&from) != Some(std::cmp::Ordering::Greater) {
                continue;
            }
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(from, y.start), (to, y.end)],
                    color.filled(),
                )))
                .map_err(plot_error)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    span.label.clone(),
                    (from, y.end),
                    (FONT, 10).into_font().color(&MUTED),
                )))
                .map_err(plot_error)?;
        }

        let mut legend = Vec::new();
        if let Some(Band {
            name,
            color,
            points,
        }) = &figure.band
        {
            let points: Vec<(f64, f64, f64)> = points
                .iter()
                .copied()
                .filter(|(x, lo, hi)| x.is_finite() && lo.is_finite() && hi.is_finite())
                .collect();
            if !points.is_empty() {
                let outline: Vec<(f64, f64)> = points
                    .iter()
                    .map(|&(x, _, hi)| (x, hi))
                    .chain(points.iter().rev().map(|&(x, lo, _)| (x, lo)))
                    .collect();
                chart
                    .draw_series(std::iter::once(Polygon::new(
                        outline,
                        color.mix(0.35).filled(),
                    )))
                    .map_err(plot_error)?;
                legend.push((name.clone(), Glyph::Band(*color)));
            }
        }
        for line in &figure.lines {
            let points = finite(&line.points);
            if points.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(points, line_style(line.color, line.dashed)))
                .map_err(plot_error)?;
            legend.push((line.name.clone(), Glyph::Line(line.color, line.dashed)));
        }
        draw_legend(&root, &legend)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn figure(points: Vec<(f64, f64)>, marks: Vec<Mark>) -> LevelFigure {
        LevelFigure {
            title: "Throughput".into(),
            x: LevelAxis::new("concurrency", &[4.0, 8.0, 16.0, 32.0]),
            y_label: "req/s".into(),
            unit: Unit::Count,
            lines: vec![Line {
                name: "run".into(),
                color: RUN_SHADES[0][0],
                points,
                dashed: false,
            }],
            marks,
        }
    }

    #[test]
    fn the_level_axis_has_each_level_once_in_order() {
        let axis = LevelAxis::new("concurrency", &[16.0, 4.0, 8.0, 32.0, 16.0, f64::NAN]);
        assert_eq!(axis.levels, vec![4.0, 8.0, 16.0, 32.0]);
        assert!(matches!(
            axis.position(16.0),
            Some(SegmentValue::CenterOf(2))
        ));
        assert!(axis.position(12.0).is_none());
        assert_eq!(axis.label_at(&SegmentValue::CenterOf(3)), "32");
        // Too many levels to label each: every k-th one.
        let many: Vec<f64> = (1..=40).map(|c| c as f64 * 64.0).collect();
        let axis = LevelAxis::new("c", &many);
        let labelled = (0..40)
            .filter(|&i| !axis.label_at(&SegmentValue::CenterOf(i)).is_empty())
            .count();
        assert!(labelled <= 16, "{labelled}");
    }

    #[test]
    fn a_level_chart_is_svg_with_its_series_marks_and_labels() {
        let svg = level_chart(&figure(
            vec![(4.0, 9.0), (8.0, 14.0), (16.0, 17.2)],
            vec![
                Mark {
                    kind: MarkKind::Congested,
                    x: 16.0,
                    y: Some(17.2),
                },
                Mark {
                    kind: MarkKind::Skipped,
                    x: 32.0,
                    y: None,
                },
            ],
        ))
        .unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.contains("<polyline"), "no line drawn");
        for text in [
            "Throughput",
            "concurrency",
            "congested",
            "skipped (not run)",
            ">\n16\n<",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn non_finite_values_never_reach_the_svg() {
        let svg = level_chart(&figure(
            vec![(4.0, f64::NAN), (8.0, f64::INFINITY), (16.0, 3.0)],
            vec![Mark {
                kind: MarkKind::NoData,
                x: 8.0,
                y: Some(f64::NAN),
            }],
        ))
        .unwrap();
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        // Nothing at all to draw still gives a chart.
        let empty = level_chart(&figure(vec![], vec![])).unwrap();
        assert!(empty.starts_with("<svg"));
        let timeline = timeline_chart(&TimelineFigure {
            title: "Requests".into(),
            y_label: "req/s".into(),
            unit: Unit::Count,
            end_s: f64::NAN,
            spans: vec![],
            band: Some(Band {
                name: "TTFT".into(),
                color: RUN_SHADES[0][1],
                points: vec![(1.0, f64::NAN, 2.0)],
            }),
            lines: vec![],
        })
        .unwrap();
        assert!(!timeline.contains("NaN"));
    }
}
