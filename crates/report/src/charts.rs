//! How the report's charts are drawn: SVG from plotters, no script.
//!
//! Two kinds of figure, both described as plain data by the page
//! ([`crate::html`]) and drawn here:
//! - [`LevelFigure`]: a quantity against the stage level (concurrency or
//!   rate), one line per series (with error bars when the quantity is an
//!   estimate: an eval's accuracy), with marks for the congested stage,
//!   skipped stages and stages whose server signal had no data;
//! - [`TimelineFigure`]: a quantity over the run's time, with the stages
//!   shaded behind it (the gaps between them are the checks, when the load
//!   holds the finished stage's level).
//!
//! Every value is drawn in bounded time, whatever it is: NaN is left out,
//! so a chart never carries a broken path; the y axis is scaled to the
//! measured values, and values above it (a reading of `f64::MAX` or `+Inf`
//! standing for "beyond the histogram", a threshold set far above the data)
//! sit on its top edge, marked with their value on level charts.

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use crate::ReportError;

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
/// Capacity-search stages: dark, apart from every run's shade.
const SEARCHED: RGBColor = RGBColor(40, 40, 40);
/// The knee: the answer, in the green of "within bounds".
const KNEE: RGBColor = RGBColor(44, 160, 44);

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
    /// A value as the axis reads it; beyond a billion (an off-scale reading,
    /// up to `f64::MAX`) in scientific notation, never a 300-digit number.
    pub fn format(self, v: f64) -> String {
        let (shown, suffix) = match self {
            Unit::Count => (v, ""),
            Unit::Millis => (v * 1000.0, ""),
            Unit::Percent => (v * 100.0, "%"),
        };
        let text = if !shown.is_finite() {
            if shown > 0.0 { "∞" } else { "-∞" }.to_string()
        } else if shown.abs() >= 1e9 {
            format!("{shown:.2e}")
        } else if self != Unit::Count || shown.abs() >= 1000.0 || shown.fract() == 0.0 {
            format!("{shown:.0}")
        } else {
            format!("{shown:.1}")
        };
        format!("{text}{suffix}")
    }

    /// A tick label of an axis spanning `span` (in the values' own units):
    /// as many decimals as the ticks' spacing needs, so that a small range
    /// never reads `0, 0, 1, 2, 2, 2, 3`.
    pub fn tick(self, v: f64, span: f64) -> String {
        let scale = match self {
            Unit::Count => 1.0,
            Unit::Millis => 1000.0,
            Unit::Percent => 100.0,
        };
        // About ten ticks: their spacing sets the decimals.
        let step = (span * scale / 10.0).abs();
        let decimals = if !step.is_finite() || step >= 1.0 || step == 0.0 {
            return self.format(v);
        } else {
            (-step.log10().floor()).clamp(1.0, 6.0) as usize
        };
        let suffix = if self == Unit::Percent { "%" } else { "" };
        format!("{:.*}{suffix}", decimals, v * scale)
    }
}

/// Largest magnitude a chart's axis is scaled to: beyond it a value (a
/// reading of `f64::MAX` standing for "beyond the histogram", say) is not a
/// measurement to draw to scale, and is marked off-scale at the top.
const LARGEST_SCALED: f64 = 1e12;
/// A threshold up to this many times the largest measured value is drawn
/// on the axis; a larger one (set high to switch a rule off) would flatten
/// the data, so it is marked off-scale at the top with its value.
const THRESHOLD_REACH: f64 = 4.0;

/// The y axis: 0 up to a little above the measured values and the
/// thresholds near them (1 when there is nothing).
fn y_range(measured: &[f64], thresholds: &[f64]) -> std::ops::Range<f64> {
    let scaled = |v: &f64| v.is_finite() && v.abs() <= LARGEST_SCALED;
    let data_top = measured.iter().copied().filter(scaled).fold(0.0, f64::max);
    let near = |t: &f64| data_top <= 0.0 || *t <= data_top * THRESHOLD_REACH;
    let top = thresholds
        .iter()
        .copied()
        .filter(scaled)
        .filter(near)
        .fold(data_top, f64::max);
    if top > 0.0 { 0.0..top * 1.12 } else { 0.0..1.0 }
}

/// A point on an axis that ends at `top`: values above it sit on the top
/// edge (returned apart, to be marked with their value), negative ones on
/// zero, NaN nowhere.
fn on_axis((x, y): (f64, f64), top: f64) -> Option<((f64, f64), Option<f64>)> {
    if !x.is_finite() || y.is_nan() {
        return None;
    }
    if y > top {
        Some(((x, top), Some(y)))
    } else {
        Some(((x, y.max(0.0)), None))
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
    /// A stage that did not run (along the top edge, off the data: at the
    /// bottom it read as "fell to zero").
    Skipped,
    /// A judged stage whose server signal had no data (on the x axis).
    NoData,
    /// A stage of the capacity search after the stop (at the stage's
    /// value): the levels the search added between the sweep's.
    Searched,
    /// The run's answer (at the stage's value): the highest level judged
    /// not congested below the congested ones, as the headline says.
    Knee,
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

/// An interval around a line's values (a 95% confidence interval), drawn
/// as a vertical whisker with caps at each level: `(level, low, high)`.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorBars {
    pub name: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64, f64)>,
}

/// A quantity against the stage level.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelFigure {
    pub title: String,
    pub x: LevelAxis,
    pub y_label: String,
    pub unit: Unit,
    pub lines: Vec<Line>,
    /// Drawn under the lines.
    pub error_bars: Vec<ErrorBars>,
    pub marks: Vec<Mark>,
    /// A fixed top for the y axis (an accuracy reads from 0 to 100%);
    /// `None` scales the axis to the values.
    pub y_max: Option<f64>,
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
fn plot_error(e: impl std::fmt::Display) -> ReportError {
    ReportError::Chart(e.to_string())
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
    ErrorBar(RGBColor),
    Mark(MarkKind),
    OffScale,
}

/// Draws the legend in the room kept on the right of the plotting area
/// (outside it, so it never hides data).
fn draw_legend(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    entries: &[(String, Glyph)],
) -> Result<(), ReportError> {
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
            Glyph::ErrorBar(color) => {
                let style = color.stroke_width(1);
                for path in [
                    vec![(x + 8, y - 6), (x + 8, y + 6)],
                    vec![(x + 5, y - 6), (x + 11, y - 6)],
                    vec![(x + 5, y + 6), (x + 11, y + 6)],
                ] {
                    root.draw(&PathElement::new(path, style))
                        .map_err(plot_error)?;
                }
                Ok(())
            }
            Glyph::OffScale => root.draw(&TriangleMarker::new((x + 8, y), 5, MUTED.filled())),
            Glyph::Mark(kind) => {
                let (color, width) = mark_style(kind);
                match kind {
                    MarkKind::Skipped => {
                        root.draw(&Cross::new((x + 8, y), 4, color.stroke_width(width)))
                    }
                    MarkKind::Searched => root.draw(&Rectangle::new(
                        [(x + 4, y - 4), (x + 12, y + 4)],
                        color.stroke_width(width),
                    )),
                    MarkKind::Knee => root.draw(&TriangleMarker::new(
                        (x + 8, y),
                        5,
                        color.stroke_width(width),
                    )),
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

/// Where a mark sits on an axis spanning `y`: at its value, else a
/// skipped stage along the top edge and a missing value on the bottom.
fn mark_y(mark: &Mark, y: &std::ops::Range<f64>) -> f64 {
    match mark.y.filter(|v| !v.is_nan()) {
        Some(v) => v,
        None if mark.kind == MarkKind::Skipped => y.end,
        None => y.start,
    }
}

fn mark_style(kind: MarkKind) -> (RGBColor, u32) {
    match kind {
        MarkKind::Congested => (CONGESTED, 3),
        MarkKind::Skipped => (MUTED, 2),
        MarkKind::NoData => (MUTED, 1),
        MarkKind::Searched => (SEARCHED, 2),
        MarkKind::Knee => (KNEE, 3),
    }
}

/// Draws a level figure as an SVG document. Every value ends on the chart
/// in bounded time: the axis is scaled to the measured values (and the
/// thresholds near them) unless the figure fixes its top, and what lies
/// above it sits on the top edge, marked with its value.
pub fn level_chart(figure: &LevelFigure) -> Result<String, ReportError> {
    let axis = &figure.x;
    let at = |(x, y): (f64, f64)| Some((axis.position(x)?, y));
    let ys = |dashed: bool| -> Vec<f64> {
        let lines = figure.lines.iter().filter(|l| l.dashed == dashed);
        let values = lines.flat_map(|l| l.points.iter().map(|p| p.1));
        if dashed {
            values.collect()
        } else {
            let bars = figure.error_bars.iter().flat_map(|b| &b.points);
            values
                .chain(bars.map(|p| p.2))
                .chain(figure.marks.iter().filter_map(|m| m.y))
                .collect()
        }
    };
    let y = match figure.y_max {
        Some(top) if top.is_finite() && top > 0.0 => 0.0..top,
        _ => y_range(&ys(false), &ys(true)),
    };
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
            .y_label_formatter(&|v| unit.tick(*v, y.end - y.start))
            .disable_x_mesh()
            .light_line_style(WHITE)
            .draw()
            .map_err(plot_error)?;

        let mut legend = Vec::new();
        // Under the lines: a whisker from low to high (held within the
        // axis), capped at both ends; named in the legend after the lines.
        let mut bars_legend = Vec::new();
        for bars in &figure.error_bars {
            let mut drawn = false;
            for &(x, low, high) in &bars.points {
                if low.is_nan() || high.is_nan() {
                    continue;
                }
                let (low, high) = (low.clamp(y.start, y.end), high.clamp(y.start, y.end));
                let (Some(bottom), Some(top)) = (at((x, low)), at((x, high))) else {
                    continue;
                };
                let style = bars.color.stroke_width(1);
                let cap = |p| EmptyElement::at(p) + PathElement::new(vec![(-4, 0), (4, 0)], style);
                chart
                    .draw_series([PathElement::new(vec![bottom.clone(), top.clone()], style)])
                    .map_err(plot_error)?;
                chart
                    .draw_series([cap(bottom), cap(top)])
                    .map_err(plot_error)?;
                drawn = true;
            }
            if drawn {
                bars_legend.push((bars.name.clone(), Glyph::ErrorBar(bars.color)));
            }
        }
        // Points above the axis: where they sit on its edge, and their label.
        let mut off_scale = Vec::new();
        for line in &figure.lines {
            let mut points = Vec::new();
            for &point in &line.points {
                let Some((on, above)) = on_axis(point, y.end) else {
                    continue;
                };
                let Some(position) = at(on) else { continue };
                points.push(position.clone());
                if let Some(value) = above {
                    // A threshold is one value: labelled once, at its first level.
                    if !line.dashed || !off_scale.iter().any(|(_, _, name)| name == &line.name) {
                        off_scale.push((position, value, line.name.clone()));
                    }
                }
            }
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
        legend.extend(bars_legend);
        if !off_scale.is_empty() {
            let font = (FONT, 10).into_font().color(&BLACK);
            for (position, value, name) in off_scale {
                let text = match figure.lines.iter().find(|l| l.name == name) {
                    Some(line) if line.dashed => format!("{name} {} ↑", unit.format(value)),
                    _ => format!("{} ↑", unit.format(value)),
                };
                chart
                    .draw_series([EmptyElement::at(position.clone())
                        + TriangleMarker::new((0, 0), 5, MUTED.filled())])
                    .map_err(plot_error)?;
                chart
                    .draw_series([
                        EmptyElement::at(position) + Text::new(text, (6, 2), font.clone())
                    ])
                    .map_err(plot_error)?;
            }
            legend.push(("above the axis (value shown)".to_owned(), Glyph::OffScale));
        }

        // A search stage's square over a congested stage's circle.
        let kinds = [
            MarkKind::Skipped,
            MarkKind::NoData,
            MarkKind::Congested,
            MarkKind::Searched,
            MarkKind::Knee,
        ];
        for kind in kinds {
            let points: Vec<_> = figure
                .marks
                .iter()
                .filter(|m| m.kind == kind)
                .filter_map(|m| at(on_axis((m.x, mark_y(m, &y)), y.end)?.0))
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
                MarkKind::Searched => chart.draw_series(
                    points
                        .into_iter()
                        .map(|p| EmptyElement::at(p) + Rectangle::new([(-5, -5), (5, 5)], style)),
                ),
                MarkKind::Knee => chart.draw_series(
                    points
                        .into_iter()
                        .map(|p| EmptyElement::at(p) + TriangleMarker::new((0, -11), 6, style)),
                ),
            }
            .map_err(plot_error)?;
            let name = match kind {
                MarkKind::Congested => "congested",
                MarkKind::Skipped => "skipped (not run, no value)",
                MarkKind::NoData => "no data",
                MarkKind::Searched => "capacity search stage",
                MarkKind::Knee => "knee (highest level not congested)",
            };
            legend.push((name.to_owned(), Glyph::Mark(kind)));
        }
        draw_legend(&root, &legend)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// Draws a timeline figure as an SVG document.
pub fn timeline_chart(figure: &TimelineFigure) -> Result<String, ReportError> {
    let end = if figure.end_s.is_finite() && figure.end_s > 0.0 {
        figure.end_s
    } else {
        1.0
    };
    let measured: Vec<f64> = figure
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .chain(
            figure
                .band
                .iter()
                .flat_map(|band| band.points.iter().map(|p| p.2)),
        )
        .collect();
    let y = y_range(&measured, &[]);
    // Above the axis: on its top edge (a timeline shows the shape over time;
    // the values are in the table).
    let clamp = |v: f64| v.clamp(0.0, y.end);
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
            .y_label_formatter(&|v| unit.tick(*v, y.end - y.start))
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
                .filter(|(x, lo, hi)| x.is_finite() && !lo.is_nan() && !hi.is_nan())
                .map(|&(x, lo, hi)| (x, clamp(lo), clamp(hi)))
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
            let points: Vec<(f64, f64)> = line
                .points
                .iter()
                .filter_map(|&p| on_axis(p, y.end))
                .map(|(p, _)| p)
                .collect();
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
            error_bars: Vec::new(),
            marks,
            y_max: None,
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
            "skipped (not run, no value)",
            ">\n16\n<",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    /// Extreme readings (a quantile of `f64::MAX` or `+Inf`: "beyond the
    /// histogram") and a threshold far above the data are drawn, in bounded
    /// time, on the top edge with their values; the axis keeps the data's
    /// scale. (With the axis scaled to `f64::MAX`, drawing never ended.)
    #[test]
    fn extreme_values_sit_on_the_top_edge_with_their_value() {
        for extreme in [f64::MAX, f64::INFINITY, 1e300, 5e12] {
            let mut f = figure(
                vec![(4.0, 9.0), (8.0, 14.0), (16.0, extreme)],
                vec![Mark {
                    kind: MarkKind::Congested,
                    x: 16.0,
                    y: Some(extreme),
                }],
            );
            f.lines.push(Line {
                name: "threshold".into(),
                color: CONGESTED,
                points: vec![(4.0, 1e6), (8.0, 1e6), (16.0, 1e6), (32.0, 1e6)],
                dashed: true,
            });
            let svg = level_chart(&f).unwrap();
            assert!(svg.contains("above the axis (value shown)"), "{extreme}");
            assert!(svg.contains("threshold 1000000 ↑"), "{extreme}");
            assert_eq!(svg.matches("threshold 1000000").count(), 1, "labelled once");
            let label = Unit::Count.format(extreme);
            assert!(svg.contains(&format!("{label} ↑")), "{label}");
            // The axis is the data's: 14 is its top measured value.
            assert!(
                svg.contains(">\n14\n<") || svg.contains(">14<"),
                "{extreme}"
            );
            assert!(!svg.contains("NaN"));
            let timeline = timeline_chart(&TimelineFigure {
                title: "TTFT".into(),
                y_label: "ms".into(),
                unit: Unit::Millis,
                end_s: 30.0,
                spans: vec![],
                band: Some(Band {
                    name: "TTFT".into(),
                    color: RUN_SHADES[0][1],
                    points: vec![(1.0, 0.1, 0.2), (2.0, 0.1, extreme)],
                }),
                lines: vec![Line {
                    name: "p50".into(),
                    color: RUN_SHADES[0][0],
                    points: vec![(1.0, 0.15), (2.0, extreme), (3.0, f64::NEG_INFINITY)],
                    dashed: false,
                }],
            })
            .unwrap();
            assert!(!timeline.contains("NaN") && !timeline.contains("inf"));
        }
        assert_eq!(Unit::Count.format(f64::MAX), "1.80e308");
        assert_eq!(Unit::Millis.format(f64::MAX), "∞");
        assert_eq!(Unit::Millis.format(2.5), "2500");
        assert_eq!(Unit::Percent.format(0.95), "95%");
        assert_eq!(Unit::Count.format(17.25), "17.2");
        // Ticks of a small range are told apart (they read 0, 0, 1, 2,
        // 2, 2, 3 ms before): 0.5 ms apart on a 3 ms axis.
        let ticks: Vec<String> = (0..7)
            .map(|i| Unit::Millis.tick(f64::from(i) * 0.0005, 0.003))
            .collect();
        assert_eq!(ticks, ["0.0", "0.5", "1.0", "1.5", "2.0", "2.5", "3.0"]);
        assert_eq!(Unit::Count.tick(3.0, 40.0), "3");
        assert_eq!(Unit::Percent.tick(0.925, 0.05), "92.5%");
    }

    /// A skipped stage is marked along the top edge, off the data (at 0 it
    /// read as "throughput fell to zero"); a missing value on the bottom.
    #[test]
    fn skipped_stages_sit_on_the_top_edge() {
        let axis = 0.0..20.0;
        let mark = |kind, y| Mark { kind, x: 32.0, y };
        assert_eq!(mark_y(&mark(MarkKind::Skipped, None), &axis), 20.0);
        assert_eq!(mark_y(&mark(MarkKind::NoData, None), &axis), 0.0);
        assert_eq!(mark_y(&mark(MarkKind::Congested, Some(7.0)), &axis), 7.0);
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

    /// An accuracy chart: its axis fixed from 0 to 100% (not scaled to
    /// the values), each interval a whisker from its low to its high
    /// (held within the axis), named in the legend.
    #[test]
    fn error_bars_span_their_interval_on_a_fixed_axis() {
        let mut f = figure(vec![(4.0, 0.5), (8.0, 0.5), (16.0, 0.5)], vec![]);
        f.unit = Unit::Percent;
        f.y_max = Some(1.0);
        let without = level_chart(&f).unwrap();
        f.error_bars.push(ErrorBars {
            name: "95% interval".into(),
            color: RUN_SHADES[0][0],
            points: vec![(4.0, 0.0, 1.0), (8.0, 0.25, 0.75), (16.0, -0.5, 1.5)],
        });
        let svg = level_chart(&f).unwrap();
        assert!(svg.contains("95% interval"), "named in the legend");
        assert!(!without.contains("95% interval"));
        // The axis reads to 100% although no value is above 50%.
        assert!(svg.contains(">\n100%\n<"), "{svg}");
        // The run's polylines of a stroke width, as points in pixels.
        let polylines = |width: &str| -> Vec<Vec<(i32, i32)>> {
            let stroke = format!("stroke=\"#1F77B4\" stroke-width=\"{width}\"");
            svg.split("<polyline")
                .skip(1)
                .filter_map(|p| p.split("/>").next())
                .filter(|p| p.contains(&stroke))
                .map(|p| {
                    let points = p.split("points=\"").nth(1).unwrap().split('"').next();
                    let pair = |xy: &str| {
                        let (x, y) = xy.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    };
                    points.unwrap().split_whitespace().map(pair).collect()
                })
                .collect()
        };
        // The whiskers: thin vertical strokes left of the legend, as
        // (x, bottom, top); the line is 2 pixels wide.
        let legend_x = (SIZE.0 - LEGEND_WIDTH) as i32;
        let whiskers: Vec<(i32, i32, i32)> = polylines("1")
            .into_iter()
            .filter_map(|p| match p[..] {
                [(x0, y0), (x1, y1)] if x0 == x1 && x0 < legend_x => Some((x0, y0, y1)),
                _ => None,
            })
            .collect();
        assert_eq!(whiskers.len(), 3, "{whiskers:?}");
        let span = |w: (i32, i32, i32)| w.1 - w.2;
        let full = span(whiskers[0]);
        assert!(full > 100, "0 to 100% spans the plot: {whiskers:?}");
        // 25% to 75%: half the axis, centred on the line's 50%, at its x.
        assert!((2 * span(whiskers[1]) - full).abs() <= 2, "{whiskers:?}");
        let line = &polylines("2")[0];
        let middle = (whiskers[1].1 + whiskers[1].2) / 2;
        assert!((middle - line[1].1).abs() <= 1, "{whiskers:?} {line:?}");
        assert_eq!(whiskers[1].0, line[1].0, "{whiskers:?} {line:?}");
        // -50% to 150% is held within the axis.
        assert_eq!(span(whiskers[2]), full, "{whiskers:?}");
    }
}
