"""`moetune report`: one self-contained HTML page of a plan, its runs and their comparison.

Rendering is pure: :mod:`.data` holds the typed records a page is made from, :mod:`.gather` (the
edge) reads them from a plan file and the results history, and :func:`.page.render_page` turns
them into one HTML string. Charts are inline SVG drawn by :mod:`.svg`; the page loads nothing
(no script, font, image or style sheet from anywhere), and every string from the data is escaped.
"""
