"""The side panel that draws the last step's draft tree with the accepted path marked."""

from __future__ import annotations

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import Static, Tree

from ..messages import TreeSnapshot


def token_label(text: str) -> str:
    """A token's text made visible: spaces, newlines and tabs shown as symbols."""
    shown = text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥")
    return shown or "∅"


class DraftTreePanel(Vertical):
    """Toggle with ctrl+t. Nodes: token, draft probability; ✓ accepted, ⇄ merged (GSD), ⧉ copied from the
    conversation, ✗ rejected."""

    COMPONENT_CLASSES = {"tree--accepted", "tree--rejected", "tree--merged", "tree--copied", "tree--bonus"}

    def __init__(self) -> None:
        super().__init__(id="tree-panel")
        self.snapshot: TreeSnapshot | None = None
        self.border_title = "draft tree (last step)"

    def compose(self):
        yield Static("no draft tree yet: plain decoding, or nothing generated", id="tree-caption")
        tree: Tree[int] = Tree("·", id="draft-tree")
        tree.show_root = True
        yield tree

    def show(self, snapshot: TreeSnapshot | None) -> None:
        """Remember the latest tree; draw it if the panel is visible."""
        self.snapshot = snapshot
        if self.display and self.is_mounted:
            self.redraw()

    def redraw(self) -> None:
        snap = self.snapshot
        caption = self.query_one("#tree-caption", Static)
        tree = self.query_one("#draft-tree", Tree)
        tree.clear()
        if snap is None:
            caption.update("no draft tree yet: plain decoding, or nothing generated")
            tree.root.set_label("·")
            return
        drafted = len(snap.labels) - 1
        accepted = len(snap.accepted) - 1
        caption.update(
            f"{drafted} drafted, {accepted} accepted\n✓ accepted ✗ rejected ⇄ merged ⧉ copied + target"
        )
        tree.root.set_label(self._label(snap, 0))
        nodes = {0: tree.root}
        for i in range(1, len(snap.labels)):
            parent = nodes[snap.parents[i]]
            nodes[i] = parent.add(self._label(snap, i), data=i, expand=True)
        if snap.bonus and snap.accepted:
            last = max(snap.accepted, key=lambda n: self._depth(snap, n))
            bonus = Text("+ ", style=self.get_component_rich_style("tree--bonus"))
            bonus.append(
                f"'{token_label(snap.bonus)}' (target)", style=self.get_component_rich_style("tree--bonus")
            )
            nodes[last].add_leaf(bonus)
        tree.root.expand_all()

    @staticmethod
    def _depth(snap: TreeSnapshot, node: int) -> int:
        depth = 0
        while snap.parents[node] >= 0:
            node, depth = snap.parents[node], depth + 1
        return depth

    def _label(self, snap: TreeSnapshot, i: int) -> Text:
        if i == 0:
            return Text(f"'{token_label(snap.labels[0])}' (root)")
        on_path = i in snap.accepted
        source = "merged" if snap.merged[i] else "copied" if snap.copied[i] else ""
        role = "tree--accepted" if on_path else f"tree--{source}" if source else "tree--rejected"
        mark = "✓" if on_path else {"merged": "⇄", "copied": "⧉"}.get(source, "✗")
        label = Text(f"{mark} '{token_label(snap.labels[i])}'", style=self.get_component_rich_style(role))
        if source and on_path:
            label.append(" ⇄" if source == "merged" else " ⧉")
        label.append(f"  {snap.draft_prob[i]:.2f}", style="dim")
        return label
