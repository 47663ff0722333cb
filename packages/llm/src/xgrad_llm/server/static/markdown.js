// Markdown to HTML for the chat page: text in, safe HTML out (every character of the input is escaped; only the tags
// written here are produced). Handles what model replies use: fenced code (highlighted, an unclosed fence while the
// reply streams), headings, lists, block quotes, tables, rules, paragraphs, and inline code, bold, italic,
// strikethrough and http(s) links. Written for this page; no library.
"use strict";

const Markdown = (() => {
  const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

  // ---- code highlighting: comments, strings, numbers and keywords of common languages ----
  const KEYWORDS = new Set((
    "and as assert async await break case catch class const continue def del do elif else enum except export extends " +
    "false finally fn for from func function go if impl import in interface is lambda let loop match mod mut new nil " +
    "none None not null or package pass pub raise return self Self static struct super switch this throw true True " +
    "False try type typeof undefined use var void while with yield int float double char bool string long unsigned " +
    "auto template typename namespace public private protected virtual override echo then fi done esac local"
  ).split(" "));
  const HASH_COMMENT = new Set(["python", "py", "bash", "sh", "shell", "ruby", "rb", "yaml", "yml", "toml", "r", "perl", "make", "makefile", "dockerfile"]);

  function highlight(code, lang) {
    lang = (lang || "").toLowerCase();
    const hash = HASH_COMMENT.has(lang);
    const parts = [
      hash ? "#[^\\n]*" : "\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?(?:\\*\\/|$)",  // comments
      lang === "sql" || lang === "lua" ? "--[^\\n]*" : null,
      '"""[\\s\\S]*?(?:"""|$)', "'''[\\s\\S]*?(?:'''|$)",  // python's long strings
      '"(?:\\\\.|[^"\\\\\\n])*"?', "'(?:\\\\.|[^'\\\\\\n])*'?", "`(?:\\\\.|[^`\\\\])*`?",  // strings
      "\\b(?:0x[0-9a-fA-F_]+|\\d[\\d_]*(?:\\.\\d+)?(?:[eE][+-]?\\d+)?)\\b",  // numbers
      "[A-Za-z_][A-Za-z0-9_]*",  // words (keywords or not)
    ].filter(Boolean);
    const re = new RegExp(parts.join("|"), "g");
    let out = "", last = 0, m;
    while ((m = re.exec(code)) !== null) {
      out += escapeHtml(code.slice(last, m.index));
      const t = m[0];
      let cls = null;
      if (t.startsWith("//") || t.startsWith("/*") || (hash && t.startsWith("#")) || (t.startsWith("--") && parts[1])) cls = "com";
      else if (/^["'`]/.test(t)) cls = "str";
      else if (/^\d/.test(t)) cls = "num";
      else if (KEYWORDS.has(t)) cls = "kw";
      out += cls ? `<span class="tok-${cls}">${escapeHtml(t)}</span>` : escapeHtml(t);
      last = m.index + t.length;
    }
    return out + escapeHtml(code.slice(last));
  }

  // ---- inline ----
  function inline(text) {
    const codes = [];
    let s = text.replace(/`([^`\n]+)`/g, (_, c) => { codes.push(c); return `\u0000${codes.length - 1}\u0000`; });
    s = escapeHtml(s);
    s = s.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g, (_, label, url) => `<a href="${url}" target="_blank" rel="noopener noreferrer">${label}</a>`);
    s = s.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>").replace(/__([^_\n]+)__/g, "<strong>$1</strong>");
    s = s.replace(/(^|[^*\w])\*([^*\n]+)\*(?!\w)/g, "$1<em>$2</em>").replace(/(^|[^_\w])_([^_\n]+)_(?!\w)/g, "$1<em>$2</em>");
    s = s.replace(/~~([^~\n]+)~~/g, "<del>$1</del>");
    return s.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${escapeHtml(codes[+i])}</code>`);
  }

  // ---- blocks ----
  const isTableRow = (l) => /^\s*\|.*\|\s*$/.test(l);
  const cells = (l) => l.trim().replace(/^\||\|$/g, "").split("|").map((c) => c.trim());

  function render(text) {
    const lines = text.replace(/\r\n?/g, "\n").split("\n");
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
      if (fence) {
        const body = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        i++;  // the closing fence (or the end: the reply is still streaming)
        const lang = fence[2];
        out.push(`<pre>${lang ? `<span class="lang">${escapeHtml(lang)}</span>` : ""}<code>${highlight(body.join("\n"), lang)}</code></pre>`);
        continue;
      }
      const h = line.match(/^(#{1,6})\s+(.*)$/);
      if (h) { out.push(`<h${h[1].length}>${inline(h[2])}</h${h[1].length}>`); i++; continue; }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { out.push("<hr>"); i++; continue; }
      if (/^\s*>/.test(line)) {
        const quote = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) quote.push(lines[i++].replace(/^\s*>\s?/, ""));
        out.push(`<blockquote>${render(quote.join("\n"))}</blockquote>`);
        continue;
      }
      if (isTableRow(line) && i + 1 < lines.length && /^\s*\|?[\s:|-]+\|?\s*$/.test(lines[i + 1]) && lines[i + 1].includes("-")) {
        const head = cells(line).map((c) => `<th>${inline(c)}</th>`).join("");
        i += 2;
        const rows = [];
        while (i < lines.length && isTableRow(lines[i])) rows.push(`<tr>${cells(lines[i++]).map((c) => `<td>${inline(c)}</td>`).join("")}</tr>`);
        out.push(`<table><thead><tr>${head}</tr></thead><tbody>${rows.join("")}</tbody></table>`);
        continue;
      }
      const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
      if (item) {
        const ordered = /\d/.test(item[1]);
        const items = [];
        while (i < lines.length) {
          const m = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
          if (m && /\d/.test(m[1]) === ordered) { items.push(m[2]); i++; }
          else if (lines[i].match(/^\s{2,}\S/) && items.length) { items[items.length - 1] += " " + lines[i].trim(); i++; }
          else break;
        }
        const tag = ordered ? "ol" : "ul";
        out.push(`<${tag}>${items.map((t) => `<li>${inline(t)}</li>`).join("")}</${tag}>`);
        continue;
      }
      if (!line.trim()) { i++; continue; }
      const para = [];
      while (i < lines.length && lines[i].trim() && !/^\s*(```|~~~|#{1,6}\s|>|([-*+]|\d+[.)])\s)/.test(lines[i])) para.push(lines[i++]);
      if (!para.length) para.push(lines[i++]);
      out.push(`<p>${para.map(inline).join("<br>")}</p>`);
    }
    return out.join("\n");
  }

  return { render, highlight, escapeHtml };
})();

if (typeof module !== "undefined") module.exports = Markdown;
