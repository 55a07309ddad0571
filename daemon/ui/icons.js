// The viewer's icons: line drawings on a 24-unit grid, stroked in the current text colour, made
// as masks (see icon(); nothing fetched). Drawn for this viewer.

const SVG_NS = "http://www.w3.org/2000/svg";

// name -> list of SVG shapes: [tag, {attributes}]; most are paths.
const P = (d) => ["path", { d }];
const SHAPES = {
  plus: [P("M12 5v14M5 12h14")],
  search: [["circle", { cx: 11, cy: 11, r: 6.5 }], P("M16 16l4.5 4.5")],
  menu: [P("M4 7h16M4 12h16M4 17h16")],
  close: [P("M6 6l12 12M18 6L6 18")],
  sun: [["circle", { cx: 12, cy: 12, r: 4 }],
    P("M12 2.5v2M12 19.5v2M2.5 12h2M19.5 12h2M5.3 5.3l1.4 1.4M17.3 17.3l1.4 1.4M5.3 18.7l1.4-1.4M17.3 6.7l1.4-1.4")],
  moon: [P("M20 14.5A8 8 0 1 1 9.5 4a6.5 6.5 0 0 0 10.5 10.5z")],
  folder: [P("M3.5 7.5a2 2 0 0 1 2-2h4l2 2.5h7a2 2 0 0 1 2 2v7.5a2 2 0 0 1-2 2h-13a2 2 0 0 1-2-2z")],
  branch: [["circle", { cx: 7, cy: 5.5, r: 2 }], ["circle", { cx: 7, cy: 18.5, r: 2 }],
    ["circle", { cx: 17, cy: 8, r: 2 }], P("M7 7.5v9M17 10c0 4-6 3-9.5 6.8")],
  shield: [P("M12 3l7 3v5.5c0 4.5-3 8-7 9.5-4-1.5-7-5-7-9.5V6z"), P("M9 12l2 2 4-4")],
  send: [P("M12 19V5M6 11l6-6 6 6")],
  stop: [["rect", { x: 7, y: 7, width: 10, height: 10, rx: 1.5 }]],
  refresh: [P("M19.5 12a7.5 7.5 0 1 1-2.2-5.3"), P("M19.5 4.5v4h-4")],
  copy: [["rect", { x: 8.5, y: 8.5, width: 11, height: 11, rx: 2 }],
    P("M15.5 8.5V6.5a2 2 0 0 0-2-2h-7a2 2 0 0 0-2 2v7a2 2 0 0 0 2 2h2")],
  check: [P("M5 12.5l4.5 4.5L19 7.5")],
  chevronRight: [P("M9.5 6l6 6-6 6")],
  chevronDown: [P("M6 9.5l6 6 6-6")],
  chevronUp: [P("M6 14.5l6-6 6 6")],
  archive: [["rect", { x: 3.5, y: 4.5, width: 17, height: 4, rx: 1 }],
    P("M5 8.5v10a1.5 1.5 0 0 0 1.5 1.5h11a1.5 1.5 0 0 0 1.5-1.5v-10M10 12.5h4")],
  alert: [P("M12 4l9 16H3z"), P("M12 10v4.5M12 17.3v.2")],
  info: [["circle", { cx: 12, cy: 12, r: 8.5 }], P("M12 11v5.5M12 7.8v.2")],
  tool: [P("M14.5 5.5a4 4 0 0 0 4.8 4.8l-9.1 9.1a2.1 2.1 0 0 1-3-3l9.1-9.1a4 4 0 0 0-1.8-1.8z")],
  spark: [P("M12 3.5l1.9 5.1 5.1 1.9-5.1 1.9L12 17.5l-1.9-5.1L5 10.5l5.1-1.9z"), P("M18.5 16.5l.8 2 2 .8-2 .8-.8 2-.8-2-2-.8 2-.8z")],
  user: [["circle", { cx: 12, cy: 8.5, r: 3.5 }], P("M5 19.5c1-3.5 3.8-5 7-5s6 1.5 7 5")],
  agent: [["rect", { x: 5, y: 7.5, width: 14, height: 11, rx: 3 }], P("M12 4v3.5M9.5 12.5v1M14.5 12.5v1"),
    P("M3 12v3M21 12v3")],
  trash: [P("M4.5 7h15M9.5 7V5h5v2M6.5 7l1 12.5h9l1-12.5")],
  key: [["circle", { cx: 8, cy: 15, r: 3.5 }], P("M10.5 12.5L19 4M16 7l2.5 2.5M14 9l2 2")],
  plug: [P("M9 3.5v4M15 3.5v4M6.5 7.5h11v3a5.5 5.5 0 0 1-11 0zM12 16v4.5")],
  clock: [["circle", { cx: 12, cy: 12, r: 8.5 }], P("M12 7.5V12l3 2")],
  queue: [P("M4 6.5h16M4 12h10M4 17.5h7"), P("M17 15l3 2.5-3 2.5")],
  lock: [["rect", { x: 5, y: 10.5, width: 14, height: 10, rx: 2 }], P("M8 10.5V8a4 4 0 0 1 8 0v2.5")],
  external: [P("M13.5 5h5.5v5.5M19 5l-8 8"), P("M17 13.5v4a1.5 1.5 0 0 1-1.5 1.5h-9A1.5 1.5 0 0 1 5 17.5v-9A1.5 1.5 0 0 1 6.5 7H10.5")],
  sidebar: [["rect", { x: 3.5, y: 4.5, width: 17, height: 15, rx: 2 }], P("M9.5 4.5v15")],
  back: [P("M14.5 6l-6 6 6 6")],
};

// An icon is a <span> painted in the current text colour through a mask: the drawing, as an SVG
// image (a data: URL made from the shapes above, never from anything the page receives). Not an
// inline <svg>: the browser visits every <svg> element in the document on every frame (its
// animation clock). The image is set by one rule per icon (.icon-NAME { --icon: url(...) }) in a
// stylesheet made once, not on each span: a transcript block's icons then carry no style of
// their own to parse and match, and spans of the same icon and size share their computed style.
let sheetMade = false;

function escapeAttr(value) {
  return String(value).replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;");
}

function imageUrl(shapes) {
  const body = shapes.map(([tag, attrs]) => `<${tag} ${Object.entries(attrs)
    .map(([key, value]) => `${key}="${escapeAttr(value)}"`).join(" ")}/>`).join("");
  const svg = `<svg xmlns="${SVG_NS}" viewBox="0 0 24 24" fill="none" stroke="black" ` +
    `stroke-width="1.8" stroke-linecap="round" stroke-linejoin="round">${body}</svg>`;
  return `url("data:image/svg+xml,${encodeURIComponent(svg)}")`;
}

// The icons' stylesheet (a constructed one: the page's policy allows no inline style elements).
function makeSheet() {
  const sheet = new CSSStyleSheet();
  sheet.replaceSync(Object.entries(SHAPES)
    .map(([name, shapes]) => `.icon-${name} { --icon: ${imageUrl(shapes)}; }`).join("\n"));
  document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
  sheetMade = true;
}

const SIZES = new Set([12, 14, 16, 28]);   // sized by class (viewer.css); any other inline

export function icon(name, { size = 16, label = null } = {}) {
  if (SHAPES[name] === undefined) throw new Error(`no icon ${name}`);
  if (!sheetMade) makeSheet();
  const span = document.createElement("span");
  if (SIZES.has(size)) span.className = `icon icon-${name} icon-${size}`;
  else {
    span.className = `icon icon-${name}`;
    span.style.width = `${size}px`;
    span.style.height = `${size}px`;
  }
  if (label === null) span.setAttribute("aria-hidden", "true");
  else { span.setAttribute("role", "img"); span.setAttribute("aria-label", label); }
  return span;
}

export const ICON_NAMES = Object.freeze(Object.keys(SHAPES));
