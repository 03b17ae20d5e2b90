"""Figures and the self-contained HTML report of a run folder."""

from gradleak.report.figures import save_image_grid, save_line_plot, save_loss_plot
from gradleak.report.html import render_report

__all__ = ["render_report", "save_image_grid", "save_line_plot", "save_loss_plot"]
