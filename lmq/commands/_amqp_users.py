"""`lmq amqp user ...` and `lmq amqp vhost ...`: manage the AMQP users file (users,
virtual hosts, permissions; gateway/amqp/users.py, docs/amqp.md). A running gateway
reads the file again when it changes."""

from __future__ import annotations

import argparse
import sys

DEFAULT_USERS_FILE = "amqp-users.json"


def register(amqp_parser: argparse.ArgumentParser) -> None:
    sub = amqp_parser.add_subparsers(dest="amqp_command", metavar="{user,vhost}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--users-file", default=DEFAULT_USERS_FILE,
                        help="the users file (default %(default)s; created when missing, "
                             "starting from vhost / and guest/guest)")

    user = sub.add_parser("user", help="add, delete, list users; set their permissions")
    users = user.add_subparsers(dest="user_command", required=True)
    p = users.add_parser("add", parents=[common], help="add a user")
    p.add_argument("name")
    p.add_argument("password", nargs="?", help="the password (read from stdin if omitted)")
    p.add_argument("--tags", default="", help="comma-separated tags")
    p = users.add_parser("change-password", parents=[common], help="set a user's password")
    p.add_argument("name")
    p.add_argument("password", nargs="?", help="the password (read from stdin if omitted)")
    p = users.add_parser("delete", parents=[common], help="delete a user")
    p.add_argument("name")
    users.add_parser("list", parents=[common], help="list users and their permissions")
    p = users.add_parser("set-permissions", parents=[common],
                         help="configure / write / read regular expressions on a vhost")
    p.add_argument("name")
    p.add_argument("configure")
    p.add_argument("write")
    p.add_argument("read")
    p.add_argument("--vhost", "-p", default="/", help="virtual host (default /)")
    p = users.add_parser("clear-permissions", parents=[common],
                         help="remove a user's permissions on a vhost")
    p.add_argument("name")
    p.add_argument("--vhost", "-p", default="/", help="virtual host (default /)")

    vhost = sub.add_parser("vhost", help="add, delete, list virtual hosts")
    vhosts = vhost.add_subparsers(dest="vhost_command", required=True)
    p = vhosts.add_parser("add", parents=[common], help="add a virtual host")
    p.add_argument("vhost")
    p = vhosts.add_parser("delete", parents=[common], help="delete a virtual host")
    p.add_argument("vhost")
    vhosts.add_parser("list", parents=[common], help="list virtual hosts")


def _password(args: argparse.Namespace) -> str:
    if args.password is not None:
        return args.password
    line = sys.stdin.readline()
    return line.rstrip("\r\n")


def run(args: argparse.Namespace) -> int:
    from gateway.amqp.users import UserDb

    path = args.users_file
    try:
        db = UserDb.load(path)
        if args.amqp_command == "user":
            cmd = args.user_command
            if cmd == "list":
                for name in sorted(db.users):
                    tags = ",".join(db.users[name].get("tags", []))
                    print(f"{name}\t[{tags}]")
                    for vhost in db.vhosts:
                        p = db.permissions_of(name, vhost)
                        if p is not None:
                            print(f"  {vhost}\tconfigure={p.configure!r} write={p.write!r} "
                                  f"read={p.read!r}")
                return 0
            if cmd == "add":
                tags = [t for t in args.tags.split(",") if t]
                db.add_user(args.name, _password(args), tags)
            elif cmd == "change-password":
                db.change_password(args.name, _password(args))
            elif cmd == "delete":
                db.delete_user(args.name)
            elif cmd == "set-permissions":
                db.set_permissions(args.name, args.vhost, args.configure, args.write, args.read)
            elif cmd == "clear-permissions":
                db.clear_permissions(args.name, args.vhost)
        else:
            cmd = args.vhost_command
            if cmd == "list":
                for vhost in db.vhosts:
                    print(vhost)
                return 0
            if cmd == "add":
                db.add_vhost(args.vhost)
            else:
                db.delete_vhost(args.vhost)
        db.save(path)
    except (OSError, ValueError) as exc:
        print(f"lmq amqp: {exc}", file=sys.stderr)
        return 2
    return 0
