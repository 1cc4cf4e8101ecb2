"""Write each declared command's option table into its docs page (dpdistill.commands.DECLARED), between the markers
<!-- options NAME --> and <!-- /options NAME -->, from its declaration: run after changing one; a test checks they
agree."""

from pathlib import Path

from dpdistill.api import api_name
from dpdistill.commands import DECLARED
from dpdistill.options import option_table

DOCS = Path(__file__).resolve().parents[1] / "docs"


def main() -> None:
    for name, declared in DECLARED.items():
        page = DOCS / declared.docs
        text = page.read_text()
        start, end = f"<!-- options {name} -->", f"<!-- /options {name} -->"
        table = f"{start}\n`dpdistill {name}` (and `dpdistill.{api_name(name)}(...)`, the same names with " \
                f"underscores):\n\n{option_table(declared.spec())}\n{end}"
        if start in text:
            before, rest = text.split(start, 1)
            text = before + table + rest.split(end, 1)[1]
        else:
            text = text.rstrip("\n") + f"\n\n## Options\n\n{table}\n"
        page.write_text(text)
        print(f"{page}: {len(declared.spec().options)} options")


if __name__ == "__main__":
    main()
