// Render the maths pymdownx.arithmatex (generic mode) leaves in the page:
// \( ... \) inline and \[ ... \] displayed. KaTeX is vendored in javascripts/katex/.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "$$", right: "$$", display: true },
      { left: "$", right: "$", display: false },
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
    throwOnError: true,
  });
});
