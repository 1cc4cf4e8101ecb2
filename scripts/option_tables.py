"""Write each declared command's option table into its docs page (dpdistill.commands.DECLARED), between the markers
<!-- options --> and <!-- /options -->, from its declaration: run after changing one; a test checks they agree."""

from pathlib import Path

from dpdistill.commands import DECLARED
from dpdistill.options import option_table

START, END = "<!-- options -->", "<!-- /options -->"
DOCS = Path(__file__).resolve().parents[1] / "docs"


def main() -> None:
    for name, declared in DECLARED.items():
        page = DOCS / declared.docs
        text = page.read_text()
        table = f"{START}\n`dpdistill {name}` (and `dpdistill.{name.replace('-', '_')}(...)`, the same names with " \
                f"underscores):\n\n{option_table(declared.spec())}\n{END}"
        if START in text:
            before, rest = text.split(START, 1)
            text = before + table + rest.split(END, 1)[1]
        else:
            text = text.rstrip("\n") + f"\n\n## Options\n\n{table}\n"
        page.write_text(text)
        print(f"{page}: {len(declared.spec().options)} options")


if __name__ == "__main__":
    main()
