"""The Sudoku tab's input: a 9x9 board of one-character cells, box lines after columns and rows 3 and 6.

A ``gr.HTML`` whose value is the puzzle as 81 characters (0 = blank): the browser draws the cells from the value
(``BOARD_TEMPLATE``) and writes every edit back to it (``BOARD_SCRIPT``), so the handlers read the board as they
read a pasted puzzle. A digit 1-9 fills the cell in focus; Backspace, Delete, 0, . or space empty it; the arrow
keys and Tab move between cells; text pasted into a cell fills the board when it holds 81 cells (digits, 0 or .
for blanks, any separators), else the cells from the one in focus on.

The cells are a ninth of the component's width less the outer lines (CSS container units), at most 40 px: the
board fits whatever width the page gives it, about 300 px on a 390 px phone.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

__all__ = ["BOARD_CSS", "BOARD_SCRIPT", "BOARD_TEMPLATE", "board_input"]

# Evaluated by the browser as a JS template literal over the component's props (`value`: 81 characters). Only the
# digits 1-9 of the value reach the markup, so an API client's value cannot inject any.
BOARD_TEMPLATE = (
    '<div class="sudoku-input" role="grid" aria-label="Puzzle: 9 rows of 9 cells">'
    "${Array.from({length: 81}, (_, i) => {"
    " const d = String(value ?? '').charAt(i);"
    " const shown = d && '123456789'.includes(d) ? d : '';"
    " return '<input class=\"cell\" data-i=\"' + i + '\" value=\"' + shown + '\" maxlength=\"1\"'"
    " + ' inputmode=\"numeric\" autocomplete=\"off\" spellcheck=\"false\"'"
    " + ' aria-label=\"r' + (Math.floor(i / 9) + 1) + 'c' + (i % 9 + 1) + '\">';"
    " }).join('')}"
    "</div>"
)

# The first rule is the component's own (its width sizes the cells). Box lines: the 3rd and 6th cell of each row
# (nth-child 3n, not 9n) and rows 3 and 6 (children 19-27 and 46-54).
BOARD_CSS = """
container-type: inline-size;
.sudoku-input { --cell: min(calc((100cqi - 6px) / 9), 40px); display: grid;
  grid-template-columns: repeat(9, var(--cell)); width: max-content; margin: 4px auto;
  border: 3px solid #111827; background: #ffffff; color-scheme: light; }
.sudoku-input .cell { box-sizing: border-box; width: var(--cell); height: var(--cell); margin: 0; padding: 0;
  border: 0; border-right: 1px solid #9ca3af; border-bottom: 1px solid #9ca3af; border-radius: 0;
  background: #ffffff; color: #111827; text-align: center; caret-color: transparent;
  font: 700 calc(var(--cell) * 0.55) ui-monospace, Menlo, Consolas, monospace; }
.sudoku-input .cell:nth-child(3n) { border-right: 3px solid #111827; }
.sudoku-input .cell:nth-child(9n) { border-right: 0; }
.sudoku-input .cell:nth-child(n+19):nth-child(-n+27),
.sudoku-input .cell:nth-child(n+46):nth-child(-n+54) { border-bottom: 3px solid #111827; }
.sudoku-input .cell:nth-child(n+73) { border-bottom: 0; }
.sudoku-input .cell:focus { outline: 2px solid #2563eb; outline-offset: -2px; background: #dbeafe; }
"""

# Run once when the board is drawn (`element`: its root, `props.value`: the 81 characters, `trigger`: an event).
BOARD_SCRIPT = """
const DIGITS = '123456789';
const MOVES = {ArrowLeft: -1, ArrowRight: 1, ArrowUp: -9, ArrowDown: 9};
const board = () => Array.from({length: 81}, (_, i) => {
  const d = String(props.value ?? '').charAt(i);
  return d && DIGITS.includes(d) ? d : '0';
});
const cellOf = (target) => target && target.classList && target.classList.contains('cell') ? target : null;
const focusCell = (i) => {
  const cell = element.querySelectorAll('input.cell')[i];
  if (cell) { cell.focus(); cell.select(); }
};
const write = (cells) => {
  const value = cells.join('');
  if (value === board().join('')) return;
  props.value = value;
  setTimeout(() => trigger('input'), 0);
};
const put = (cell, digit) => {
  const cells = board();
  cells[Number(cell.dataset.i)] = digit;
  cell.value = digit === '0' ? '' : digit;
  write(cells);
};
element.addEventListener('focusin', (e) => { const cell = cellOf(e.target); if (cell) cell.select(); });
element.addEventListener('keydown', (e) => {
  const cell = cellOf(e.target);
  if (!cell || e.ctrlKey || e.metaKey || e.altKey) return;
  const i = Number(cell.dataset.i);
  if (e.key in MOVES) {
    e.preventDefault();
    const j = i + MOVES[e.key];
    if (j >= 0 && j < 81) focusCell(j);
  } else if (e.key.length === 1 && DIGITS.includes(e.key)) {
    e.preventDefault();
    put(cell, e.key);
  } else if (['Backspace', 'Delete', '0', '.', ' '].includes(e.key)) {
    e.preventDefault();
    put(cell, '0');
  }
});
element.addEventListener('input', (e) => {
  const cell = cellOf(e.target);
  if (!cell) return;
  const typed = Array.from(cell.value).filter((ch) => DIGITS.includes(ch)).pop() ?? '0';
  put(cell, typed);
});
element.addEventListener('paste', (e) => {
  const cell = cellOf(e.target);
  if (!cell) return;
  e.preventDefault();
  const text = (e.clipboardData || window.clipboardData).getData('text') || '';
  const chars = Array.from(text).filter((ch) => ('0' + DIGITS + '.').includes(ch)).map((ch) => ch === '.' ? '0' : ch);
  if (!chars.length) return;
  const cells = board();
  const start = chars.length >= 81 ? 0 : Number(cell.dataset.i);
  chars.slice(0, 81 - start).forEach((ch, k) => { cells[start + k] = ch; });
  write(cells);
});
"""


def board_input(value: str, **kwargs: Any) -> gr.HTML:
    """The board to type a puzzle into, holding ``value`` (81 characters, 0 = blank); ``kwargs`` go to gr.HTML."""
    return gr.HTML(value, html_template=BOARD_TEMPLATE, css_template=BOARD_CSS, js_on_load=BOARD_SCRIPT, **kwargs)
